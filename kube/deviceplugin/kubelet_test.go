package deviceplugin

import (
	"context"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpupool/gpupool/kube"
)

// fakeKubelet stands in for the kubelet's side of the device-plugin API,
// as kubernetes' pkg/kubelet/cm/devicemanager drives it: a registration
// server on <dir>/kubelet.sock which, when a plugin registers, dials it
// back, reads its options and keeps its ListAndWatch stream; allocation as
// the kubelet makes it (the devices not yet given, the plugin's preferred
// ones first, then Allocate, then PreStartContainer); and the pod-resources
// API, which lists the devices each pod's container was given.
type fakeKubelet struct {
	t   *testing.T
	dir string

	srv          *grpc.Server
	registered   chan *pluginapi.RegisterRequest
	updates      chan []*pluginapi.Device
	podResources string

	mu      sync.Mutex
	plugin  pluginapi.DevicePluginClient
	options *pluginapi.DevicePluginOptions
	devices []*pluginapi.Device
	given   map[string][]string // pod namespace/name → its GPU container's devices
}

// startKubelet serves the kubelet's sockets in dir until the test ends.
func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{t: t, dir: dir, registered: make(chan *pluginapi.RegisterRequest, 10),
		updates: make(chan []*pluginapi.Device, 100), given: map[string][]string{},
		podResources: filepath.Join(dir, "pod-resources.sock")}
	k.start()
	prs := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(prs, &podResourcesServer{k: k})
	ln, err := net.Listen("unix", k.podResources)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = prs.Serve(ln) }()
	t.Cleanup(func() { k.srv.Stop(); prs.Stop() })
	return k
}

func (k *fakeKubelet) start() {
	k.t.Helper()
	ln, err := net.Listen("unix", filepath.Join(k.dir, KubeletSocket))
	if err != nil {
		k.t.Fatal(err)
	}
	k.srv = grpc.NewServer()
	pluginapi.RegisterRegistrationServer(k.srv, &registrationServer{k: k})
	go func() { _ = k.srv.Serve(ln) }()
}

// restart stops the kubelet and starts it again as the kubelet starts:
// it removes the plugins' sockets, then makes its own.
func (k *fakeKubelet) restart() {
	k.t.Helper()
	k.srv.Stop()
	if err := os.Remove(filepath.Join(k.dir, Socket)); err != nil {
		k.t.Fatal(err)
	}
	k.mu.Lock()
	k.plugin, k.devices, k.given = nil, nil, map[string][]string{}
	k.mu.Unlock()
	for len(k.updates) > 0 { // what the stopped kubelet was sent
		<-k.updates
	}
	k.start()
}

type registrationServer struct {
	pluginapi.UnimplementedRegistrationServer
	k *fakeKubelet
}

// Register dials the plugin back at its endpoint, as the kubelet does,
// and keeps its device list up to date.
func (r *registrationServer) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k := r.k
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, req.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	plugin := pluginapi.NewDevicePluginClient(conn)
	options, err := plugin.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil {
		return nil, err
	}
	stream, err := plugin.ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	k.plugin, k.options = plugin, options
	k.mu.Unlock()
	go func() {
		defer func() { _ = conn.Close() }()
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			k.mu.Lock()
			current := k.plugin == plugin // not a stream of before a restart
			if current {
				k.devices = resp.Devices
			}
			k.mu.Unlock()
			if current {
				k.updates <- resp.Devices
			}
		}
	}()
	k.registered <- req
	return &pluginapi.Empty{}, nil
}

// waitRegistered waits for the plugin's next registration.
func (k *fakeKubelet) waitRegistered() *pluginapi.RegisterRequest {
	k.t.Helper()
	select {
	case req := <-k.registered:
		return req
	case <-time.After(20 * time.Second):
		k.t.Fatal("the plugin never registered")
		return nil
	}
}

// waitDevices waits for a device list that satisfies ok.
func (k *fakeKubelet) waitDevices(what string, ok func([]*pluginapi.Device) bool) []*pluginapi.Device {
	k.t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case devices := <-k.updates:
			if ok(devices) {
				return devices
			}
		case <-deadline:
			k.t.Fatalf("ListAndWatch never sent %s", what)
		}
	}
}

// allocate allocates size devices to pod's GPU container as the kubelet
// does: GetPreferredAllocation among the healthy devices not given yet,
// those it prefers first, then Allocate. The pod-resources API then lists
// them as the pod's.
func (k *fakeKubelet) allocate(ctx context.Context, pod string, size int) ([]string, *pluginapi.ContainerAllocateResponse, error) {
	k.t.Helper()
	k.mu.Lock()
	plugin := k.plugin
	given := slices.Concat(slices.Collect(maps.Values(k.given))...)
	var available []string
	for _, d := range k.devices {
		if d.Health == pluginapi.Healthy && !slices.Contains(given, d.ID) {
			available = append(available, d.ID)
		}
	}
	k.mu.Unlock()
	pref, err := plugin.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: available, AllocationSize: int32(size)}}})
	if err != nil {
		k.t.Fatalf("GetPreferredAllocation: %v", err)
	}
	ids := pref.ContainerResponses[0].DeviceIDs
	for _, id := range available {
		if len(ids) < size && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	resp, err := plugin.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		return ids, nil, err
	}
	k.mu.Lock()
	k.given[pod] = ids
	k.mu.Unlock()
	return ids, resp.ContainerResponses[0], nil
}

// preStart calls PreStartContainer for devices, as the kubelet does before
// it starts the container they were given to.
func (k *fakeKubelet) preStart(ctx context.Context, devices []string) error {
	k.mu.Lock()
	plugin := k.plugin
	k.mu.Unlock()
	_, err := plugin.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: devices})
	return err
}

type podResourcesServer struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	k *fakeKubelet
}

func (s *podResourcesServer) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	s.k.mu.Lock()
	defer s.k.mu.Unlock()
	resp := &podresourcesv1.ListPodResourcesResponse{}
	for pod, ids := range s.k.given {
		namespace, name, _ := strings.Cut(pod, "/")
		resp.PodResources = append(resp.PodResources, &podresourcesv1.PodResources{Namespace: namespace, Name: name,
			Containers: []*podresourcesv1.ContainerResources{{Name: "main", Devices: []*podresourcesv1.ContainerDevices{{ResourceName: kube.ResourceGPU, DeviceIds: ids}}}}})
	}
	return resp, nil
}
