// Package deviceplugin is gpupool's kubelet device plugin: it advertises
// bitfusion.io/gpu on a GPU-server node, in the cluster's unit, with the
// health the pool sees its GPUs in, and gives each container that asks
// the GPUs of its pod's lease.
//
// The kubelet never says which pod an Allocate is for: the plugin finds it
// as the kubelet chose it (match.go), checks its lease with the allocator,
// marks the pod allocated, and answers with the lease's environment
// (response.go). Before the container starts, the kubelet's pod-resources
// API says which pod got the devices, and the plugin refuses to start a
// container whose pod is not the one it matched.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/gpuaccess"
)

// Socket is the name of the plugin's socket in the kubelet's
// device-plugin directory.
const Socket = "gpupool.sock"

// KubeletSocket is the name of the kubelet's registration socket there.
const KubeletSocket = "kubelet.sock"

// registerRetry is how long the plugin waits to register again after the
// kubelet refused or did not answer, unless its socket is made again first.
const registerRetry = 5 * time.Second

// Config is what a Plugin serves and where.
type Config struct {
	// Node is this node's name, its GPU server's name in the pool.
	Node string
	// Unit is what one bitfusion.io/gpu stands for, the cluster's.
	Unit kube.Unit
	// MaxDevices is the most devices the node offers, BFK's allocatable:
	// those of its GPUs beyond it are not offered; 0 offers all.
	MaxDevices int
	// Allocator reads the node's server and checks leases; a servers token
	// may do both.
	Allocator *client.Client
	// Kube reads the node's pods and marks them allocated.
	Kube kubernetes.Interface
	// Dir is the kubelet's device-plugin directory, which holds its
	// registration socket and the plugin's.
	Dir string
	// PodResources is the kubelet's pod-resources socket, asked before a
	// container starts which pod its devices went to; empty skips the check.
	PodResources string
	// Poll is how often the node's GPUs and their health are read from the
	// allocator.
	Poll time.Duration
	// MPS is the host's MPS control daemon, mounted into every container.
	MPS gpuaccess.MPS
	// SimulatedDeviceDir is where the node's gpupool-server made the files
	// that stand for its simulated GPUs (its --simulated-device-dir); each
	// container gets its lease's. Empty on a node with GPUs.
	SimulatedDeviceDir string
	Logger             *slog.Logger
}

// Plugin serves the kubelet's device-plugin API for bitfusion.io/gpu.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	cfg          Config
	log          *slog.Logger
	pods         *pods
	podResources podresourcesv1.PodResourcesListerClient

	// mu guards the devices last read and the channel closed when they
	// change, which each ListAndWatch stream waits on.
	mu      sync.Mutex
	devices []*pluginapi.Device
	changed chan struct{}

	// allocating makes a match and its mark one step: the next Allocate
	// must not match the pod this one is marking.
	allocating sync.Mutex
}

// New builds a plugin; Run serves it.
func New(cfg Config) (*Plugin, error) {
	pods, err := newPods(cfg.Kube, cfg.Node)
	if err != nil {
		return nil, err
	}
	return &Plugin{cfg: cfg, log: cfg.Logger.With("node", cfg.Node), pods: pods, changed: make(chan struct{})}, nil
}

// Run reads the node's pods and GPUs, then serves the plugin and
// registers it with the kubelet, again each time the kubelet makes its
// registration socket anew (it restarted, and removed the plugin's), until
// ctx ends.
func (p *Plugin) Run(ctx context.Context) error {
	if p.cfg.PodResources != "" {
		conn, err := grpc.NewClient("unix://"+p.cfg.PodResources, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("pod-resources socket %s: %w", p.cfg.PodResources, err)
		}
		defer func() { _ = conn.Close() }()
		p.podResources = podresourcesv1.NewPodResourcesListerClient(conn)
	}
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer func() { _ = watcher.Close() }()
	if err := watcher.Add(p.cfg.Dir); err != nil {
		return fmt.Errorf("watching %s for the kubelet's socket: %w", p.cfg.Dir, err)
	}
	if !p.pods.run(ctx) || !p.readDevices(ctx) {
		return nil // ended before it could start
	}
	go p.pollDevices(ctx)
	restarts := make(chan struct{}, 1)
	go p.watchKubelet(ctx, watcher, restarts)
	for {
		stop, err := p.serve()
		if err != nil {
			return err
		}
		retry := p.register(ctx)
		select {
		case <-ctx.Done():
			stop()
			return nil
		case <-retry:
		case <-restarts:
		}
		stop()
	}
}

// serve serves the plugin on its socket, made anew.
func (p *Plugin) serve() (stop func(), err error) {
	path := filepath.Join(p.cfg.Dir, Socket)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(ln) }()
	return srv.Stop, nil // closing the listener removes the socket
}

// register registers the plugin with the kubelet. The channel it returns
// fires when registering failed and is worth trying again; it never fires
// after a success.
func (p *Plugin) register(ctx context.Context) <-chan time.Time {
	kubelet := filepath.Join(p.cfg.Dir, KubeletSocket)
	err := func() error {
		conn, err := grpc.NewClient("unix://"+kubelet, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer func() { _ = conn.Close() }()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err = pluginapi.NewRegistrationClient(conn).Register(rctx, &pluginapi.RegisterRequest{
			Version: pluginapi.Version, Endpoint: Socket, ResourceName: kube.ResourceGPU, Options: p.options()})
		return err
	}()
	if err != nil {
		p.log.Warn("registering with the kubelet failed; trying again when it starts", "socket", kubelet, "retry", registerRetry, "err", err)
		return time.After(registerRetry)
	}
	p.log.Info("registered with the kubelet", "resource", kube.ResourceGPU, "unit", p.cfg.Unit, "socket", filepath.Join(p.cfg.Dir, Socket))
	return nil
}

// watchKubelet signals restarts each time the kubelet makes its
// registration socket: it started again, and removed the plugin's.
func (p *Plugin) watchKubelet(ctx context.Context, watcher *fsnotify.Watcher, restarts chan<- struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case err := <-watcher.Errors:
			p.log.Warn("watching the kubelet's socket", "err", err)
		case ev := <-watcher.Events:
			if filepath.Base(ev.Name) != KubeletSocket || !ev.Has(fsnotify.Create) {
				continue
			}
			p.log.Info("the kubelet started again; registering again")
			p.pods.kubeletStarted()
			select {
			case restarts <- struct{}{}:
			default: // one is already waiting
			}
		}
	}
}

func (p *Plugin) options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{PreStartRequired: p.cfg.PodResources != "", GetPreferredAllocationAvailable: true}
}

// GetDevicePluginOptions asks the kubelet for GetPreferredAllocation and,
// with the pod-resources socket, PreStartContainer.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return p.options(), nil
}

// readDevices reads the node's server until the allocator answers, or
// ctx ends (false): the plugin registers with what the pool sees, never
// with nothing.
func (p *Plugin) readDevices(ctx context.Context) bool {
	t := time.NewTicker(p.cfg.Poll)
	defer t.Stop()
	for {
		err := p.refresh(ctx)
		if err == nil {
			return true
		}
		p.log.Warn("reading the node's GPUs from the allocator; trying again", "retry", p.cfg.Poll, "err", err)
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// pollDevices reads the node's server every Poll. While the allocator
// does not answer, the devices stay as last read: its outage says nothing
// of the GPUs.
func (p *Plugin) pollDevices(ctx context.Context) {
	t := time.NewTicker(p.cfg.Poll)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := p.refresh(ctx)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			p.log.Warn("reading the node's GPUs from the allocator; keeping the last read", "err", err)
		case err == nil && failing:
			p.log.Info("reading the node's GPUs from the allocator again")
		}
		failing = err != nil
	}
}

// refresh reads the node's server; a server the pool does not know has
// no devices.
func (p *Plugin) refresh(ctx context.Context) error {
	st, err := p.cfg.Allocator.Server(ctx, p.cfg.Node)
	if client.IsReason(err, api.ReasonNotFound) {
		st, err = api.ServerStatus{Name: p.cfg.Node}, nil
	}
	if err != nil {
		return err
	}
	devices := Devices(p.cfg.Unit, st)
	if p.cfg.MaxDevices > 0 && len(devices) > p.cfg.MaxDevices {
		devices = devices[:p.cfg.MaxDevices]
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if slices.EqualFunc(devices, p.devices, func(a, b *pluginapi.Device) bool { return a.ID == b.ID && a.Health == b.Health }) {
		return nil
	}
	healthy := 0
	for _, d := range devices {
		if d.Health == pluginapi.Healthy {
			healthy++
		}
	}
	p.log.Info("devices", "gpus", len(st.GPUs), "devices", len(devices), "healthy", healthy, "schedulable", st.Schedulable)
	p.devices = devices
	close(p.changed)
	p.changed = make(chan struct{})
	return nil
}

// ListAndWatch sends the devices, and again each time they change.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		p.mu.Lock()
		devices, changed := p.devices, p.changed
		p.mu.Unlock()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devices}); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}

// GetPreferredAllocation prefers the devices of the GPUs of the lease of
// the pod Allocate will match, or none when there is no such pod.
func (p *Plugin) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	p.allocating.Lock()
	defer p.allocating.Unlock()
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, c := range req.ContainerRequests {
		var ids []string
		if pod, err := p.pods.next(ctx, int(c.AllocationSize)); err == nil {
			gpus := strings.Split(pod.Annotations[kube.AnnotationGPUs], ",")
			ids = preferred(gpus, c.AvailableDeviceIDs, c.MustIncludeDeviceIDs, int(c.AllocationSize))
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Allocate answers each container with the lease of the pod it is for. A
// pod whose lease the pool no longer has, or that is not its own on this
// node, gets an error, which fails the pod's admission with its message.
func (p *Plugin) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	p.allocating.Lock()
	defer p.allocating.Unlock()
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		r, err := p.allocate(ctx, c.DevicesIds)
		if err != nil {
			p.log.Warn("allocate", "devices", len(c.DevicesIds), "err", err)
			return nil, err
		}
		resp.ContainerResponses = append(resp.ContainerResponses, r)
	}
	return resp, nil
}

func (p *Plugin) allocate(ctx context.Context, devices []string) (*pluginapi.ContainerAllocateResponse, error) {
	pod, err := p.pods.next(ctx, len(devices))
	if errors.Is(err, errNoPod) {
		return nil, status.Errorf(codes.FailedPrecondition,
			"no pod bound to node %s with a %s annotation and not yet allocated asks for %d %s", p.cfg.Node, kube.AnnotationLease, len(devices), kube.ResourceGPU)
	}
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	lease, err := p.leaseOf(ctx, pod)
	if err != nil {
		return nil, err
	}
	resp, err := containerResponse(lease, gpuaccess.Node{MPS: p.cfg.MPS, SimulatedDeviceDir: p.cfg.SimulatedDeviceDir})
	if err != nil {
		return nil, err
	}
	if err := p.pods.markAllocated(ctx, pod, devicesDigest(devices)); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	p.log.Info("allocated", "pod", pod.Namespace+"/"+pod.Name, "lease", lease.ID, "gpus", pod.Annotations[kube.AnnotationGPUs], "devices", len(devices))
	return resp, nil
}

// leaseOf is the pod's lease as the allocator has it, if it is the pod's
// own and on this node.
func (p *Plugin) leaseOf(ctx context.Context, pod *corev1.Pod) (api.Lease, error) {
	id := pod.Annotations[kube.AnnotationLease]
	who := pod.Namespace + "/" + pod.Name
	l, err := p.cfg.Allocator.Lease(ctx, id)
	switch {
	case client.IsReason(err, api.ReasonNotFound):
		return api.Lease{}, status.Errorf(codes.FailedPrecondition,
			"pod %s's lease %s is no longer in the pool (released); it gets no GPU: delete it, and its controller makes another", who, id)
	case err != nil:
		return api.Lease{}, status.Errorf(codes.Unavailable, "checking pod %s's lease %s: %v", who, id, err)
	case l.Server != p.cfg.Node:
		return api.Lease{}, status.Errorf(codes.FailedPrecondition, "pod %s's lease %s is on server %s, not on this node %s", who, id, l.Server, p.cfg.Node)
	case l.Owner.UID != string(pod.UID):
		return api.Lease{}, status.Errorf(codes.FailedPrecondition, "pod %s's annotation %s names lease %s, which is pod %s's (UID %s), not this pod's", who, kube.AnnotationLease, id, l.Owner.Pod, l.Owner.UID)
	}
	return l, nil
}

// PreStartContainer checks, before a container starts, that the pod the
// kubelet gave its devices to is the one whose lease Allocate answered.
// They differ only when a pod bound before it and asking as many devices
// never reached the kubelet's allocation (rejected first, say, for the
// node's memory pressure): the container holds that pod's lease, whose GPU
// share the pool gives to others once the rejected pod's lease ends, so it
// must not start.
func (p *Plugin) PreStartContainer(ctx context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	digest := devicesDigest(req.DevicesIds)
	namespace, name, found, err := p.kubeletPodOf(ctx, digest)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "asking the kubelet which pod holds the devices: %v", err)
	}
	if !found {
		// The pod-resources API lists no init container (other than a
		// sidecar): nothing to check against.
		return &pluginapi.PreStartContainerResponse{}, nil
	}
	pod, err := p.cfg.Kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "reading pod %s/%s: %v", namespace, name, err)
	}
	if pod.Annotations[kube.AnnotationAllocated] == digest {
		return &pluginapi.PreStartContainerResponse{}, nil
	}
	whose := "another pod's"
	if other, ok := p.pods.allocatedWith(digest); ok {
		whose = "pod " + other + "'s"
	}
	p.log.Error("refusing to start a container with another pod's lease", "pod", namespace+"/"+name, "given", whose)
	return nil, status.Errorf(codes.FailedPrecondition,
		"the kubelet allocated pod %s/%s's GPU container the devices that the device plugin answered with %s lease (a pod bound before it that the kubelet did not admit): it would use GPUs the pool does not hold for it, so it does not start; delete it, and its controller makes another", namespace, name, whose)
}

// kubeletPodOf is the pod whose container the kubelet gave the devices of
// digest, as its pod-resources API lists them.
func (p *Plugin) kubeletPodOf(ctx context.Context, digest string) (namespace, name string, found bool, err error) {
	list, err := p.podResources.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return "", "", false, err
	}
	for _, pr := range list.PodResources {
		for _, c := range pr.Containers {
			for _, d := range c.Devices {
				if d.ResourceName == kube.ResourceGPU && devicesDigest(d.DeviceIds) == digest {
					return pr.Namespace, pr.Name, true, nil
				}
			}
		}
	}
	return "", "", false, nil
}
