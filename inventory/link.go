package inventory

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gpupool/gpupool/internal/fielderr"
)

// Link is how directly two GPUs of one server reach each other, from the
// farthest to the closest, so that a larger Link is a better one. The
// levels follow what NVML tells apart (nvmlDeviceGetTopologyCommonAncestor
// and the NVLink state), folded to what a placement can promise.
type Link uint8

const (
	// LinkAny is across CPU sockets (NVML's SYSTEM), or not known.
	LinkAny Link = iota
	// LinkSocket is through the host bridge of one CPU socket (NVML's
	// NODE and HOSTBRIDGE).
	LinkSocket
	// LinkPCIeSwitch is behind one PCIe switch or a tree of them (NVML's
	// SINGLE and MULTIPLE), without the host bridge.
	LinkPCIeSwitch
	// LinkNVLink is NVLink, direct or through an NVSwitch.
	LinkNVLink
)

// linkNames are the links as the API, the CLI and the Kubernetes
// annotation spell them.
var linkNames = [...]string{LinkAny: "any", LinkSocket: "socket", LinkPCIeSwitch: "pcie-switch", LinkNVLink: "nvlink"}

func (l Link) String() string {
	if int(l) < len(linkNames) {
		return linkNames[l]
	}
	return "link(" + strconv.Itoa(int(l)) + ")"
}

// ParseLink reads a link by its name; field names the value in the error,
// a *fielderr.Error (the allocator's FieldError).
func ParseLink(field, s string) (Link, error) {
	for l, name := range linkNames {
		if s == name {
			return Link(l), nil
		}
	}
	return 0, NotALink(field, s)
}

// NotALink is the error of field's value s, which names no link.
func NotALink(field, s string) error {
	return &fielderr.Error{Field: field, Value: fielderr.Shorten(s), Limit: "is not one of " + strings.Join(linkNames[:], ", ")}
}

// MarshalText writes the link's name, so that it reads as such in JSON.
func (l Link) MarshalText() ([]byte, error) {
	if int(l) >= len(linkNames) {
		return nil, fmt.Errorf("unknown link %d", l)
	}
	return []byte(l.String()), nil
}

// UnmarshalText reads a link's name.
func (l *Link) UnmarshalText(b []byte) error {
	v, err := ParseLink("link", string(b))
	if err != nil {
		return err
	}
	*l = v
	return nil
}
