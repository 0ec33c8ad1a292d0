package httpserver

import "net"

// Listen is ln when the caller listened already, else a new TCP listener on
// address. A service's Options take such a listener beside the address its
// flag gives, for a caller that must know the port before the service
// runs (gpupool-demo, on loopback ports the system picks).
func Listen(ln net.Listener, address string) (net.Listener, error) {
	if ln != nil {
		return ln, nil
	}
	return net.Listen("tcp", address)
}
