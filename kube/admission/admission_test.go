package admission

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpupool/gpupool/kube"
)

// bfkGPUMemory is BFK's default total GPU memory, 16000 MB.
const bfkGPUMemory = 16_000_000_000

func config(u kube.Unit) Config {
	return Config{Unit: u, GPUMemoryBytes: bfkGPUMemory, SchedulerName: kube.SchedulerName}
}

// asking is a container whose limits are "name=quantity" pairs, beside one
// CPU that the webhook must leave alone.
func asking(limits ...string) corev1.Container {
	c := corev1.Container{Name: "trainer", Image: "trainer:1", Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}
	for _, l := range limits {
		name, q, _ := strings.Cut(l, "=")
		c.Resources.Limits[corev1.ResourceName(name)] = resource.MustParse(q)
	}
	return c
}

func podOf(containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ml"}, Spec: corev1.PodSpec{Containers: containers}}
}

func annotated(p *corev1.Pod, kv ...string) *corev1.Pod {
	p.Annotations = map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		p.Annotations[kv[i]] = kv[i+1]
	}
	return p
}

// apply returns p with patch applied, as kube-apiserver applies it.
func apply(t *testing.T, p *corev1.Pod, patch Patch) *corev1.Pod {
	t.Helper()
	doc, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := json.Marshal(patch)
	if err != nil {
		t.Fatal(err)
	}
	decoded, err := jsonpatch.DecodePatch(ops)
	if err != nil {
		t.Fatal(err)
	}
	if doc, err = decoded.Apply(doc); err != nil {
		t.Fatalf("applying %s: %v", ops, err)
	}
	out := &corev1.Pod{}
	if err := json.Unmarshal(doc, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// mutate mutates p under c, failing the test if c refuses it.
func mutate(t *testing.T, c Config, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	patch, errs := c.Mutate(p)
	if len(errs) > 0 {
		t.Fatalf("Mutate refused: %v", errs.ToAggregate())
	}
	return apply(t, p, patch)
}

func TestMutateNormalisesEachForm(t *testing.T) {
	for _, tc := range []struct {
		name      string
		unit      kube.Unit
		gpuMemory string // empty: BFK's 16000 MB
		limits    []string
		want      int64  // bitfusion.io/gpu
		request   string // gpupool.io/request
	}{
		{"half a GPU", kube.UnitPercent, "", []string{"bitfusion.io/gpu-amount=1", "bitfusion.io/gpu-percent=50"}, 50, `{"gpuAmount":1,"gpuPercent":50}`},
		{"half of each of two GPUs", kube.UnitPercent, "", []string{"bitfusion.io/gpu-amount=2", "bitfusion.io/gpu-percent=50"}, 100, `{"gpuAmount":2,"gpuPercent":50}`},
		{"whole GPUs by amount alone", kube.UnitPercent, "", []string{"bitfusion.io/gpu-amount=2"}, 200, `{"gpuAmount":2}`},
		{"whole GPUs by amount alone, in GPUs", kube.UnitGPUs, "", []string{"bitfusion.io/gpu-amount=2"}, 2, `{"gpuAmount":2}`},
		{"percent 100, in GPUs", kube.UnitGPUs, "", []string{"bitfusion.io/gpu-amount=3", "bitfusion.io/gpu-percent=100"}, 3, `{"gpuAmount":3,"gpuPercent":100}`},
		{"memory in megabytes, as BFK", kube.UnitPercent, "", []string{"bitfusion.io/gpu-amount=1", "bitfusion.io/gpu-memory=8000"}, 50, `{"gpuAmount":1,"gpuMemory":"8G"}`},
		{"memory as a quantity", kube.UnitPercent, "", []string{"bitfusion.io/gpu-amount=2", "bitfusion.io/gpu-memory=8000M"}, 100, `{"gpuAmount":2,"gpuMemory":"8G"}`},
		// BFK rounds the product up, not each GPU's share: 1000/16000 x 3 x 100 = 18.75.
		{"memory rounded up once", kube.UnitPercent, "", []string{"bitfusion.io/gpu-amount=3", "bitfusion.io/gpu-memory=1000"}, 19, `{"gpuAmount":3,"gpuMemory":"1G"}`},
		{"memory in Gi of an 80Gi GPU", kube.UnitPercent, "80Gi", []string{"bitfusion.io/gpu-amount=1", "bitfusion.io/gpu-memory=16Gi"}, 20, `{"gpuAmount":1,"gpuMemory":"16Gi"}`},
		{"bitfusion.io/gpu below 100 in percent", kube.UnitPercent, "", []string{"bitfusion.io/gpu=50"}, 50, `{"gpuAmount":1,"gpuPercent":50}`},
		{"the articles' 2, in percent", kube.UnitPercent, "", []string{"bitfusion.io/gpu=2"}, 2, `{"gpuAmount":1,"gpuPercent":2}`},
		{"whole GPUs in percent", kube.UnitPercent, "", []string{"bitfusion.io/gpu=300"}, 300, `{"gpuAmount":3}`},
		{"the articles' 2, in GPUs", kube.UnitGPUs, "", []string{"bitfusion.io/gpu=2"}, 2, `{"gpuAmount":2}`},
		// The articles' values: slices of 8Gi of 80Gi GPUs.
		{"the articles' 2, in slices of 8Gi", kube.MemoryUnit(8 << 30), "80Gi", []string{"bitfusion.io/gpu=2"}, 2, `{"gpuAmount":1,"gpuMemory":"16Gi"}`},
		{"a slice larger than the cluster's GPU memory", kube.MemoryUnit(8 << 30), "", []string{"bitfusion.io/gpu=3"}, 3, `{"gpuAmount":1,"gpuMemory":"24Gi"}`},
		{"half a GPU, in slices", kube.MemoryUnit(8 << 30), "80Gi", []string{"bitfusion.io/gpu-amount=1", "bitfusion.io/gpu-percent=50"}, 5, `{"gpuAmount":1,"gpuPercent":50}`},
		{"whole GPUs, in slices", kube.MemoryUnit(8 << 30), "80Gi", []string{"bitfusion.io/gpu-amount=2"}, 20, `{"gpuAmount":2}`},
		{"memory rounded up to slices", kube.MemoryUnit(8 << 30), "80Gi", []string{"bitfusion.io/gpu-amount=1", "bitfusion.io/gpu-memory=12Gi"}, 2, `{"gpuAmount":1,"gpuMemory":"12Gi"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := config(tc.unit)
			if tc.gpuMemory != "" {
				q := resource.MustParse(tc.gpuMemory)
				c.GPUMemoryBytes = q.Value()
			}
			got := mutate(t, c, podOf(asking(tc.limits...)))
			want := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), kube.ResourceGPU: *resource.NewQuantity(tc.want, resource.DecimalSI)}
			res := got.Spec.Containers[0].Resources
			if !equality.Semantic.DeepEqual(res.Limits, want) || !equality.Semantic.DeepEqual(res.Requests, corev1.ResourceList{kube.ResourceGPU: want[kube.ResourceGPU]}) {
				t.Errorf("resources = %v, want limits %v and requests of bitfusion.io/gpu %d", res, want, tc.want)
			}
			if r := got.Annotations[kube.AnnotationRequest]; r != tc.request {
				t.Errorf("request = %s, want %s", r, tc.request)
			}
			if s := got.Annotations[kube.AnnotationStatus]; s != kube.StatusInjected {
				t.Errorf("status = %q", s)
			}
			if got.Spec.SchedulerName != kube.SchedulerName {
				t.Errorf("schedulerName = %q", got.Spec.SchedulerName)
			}
			if patch, errs := c.Mutate(got); patch != nil || len(errs) > 0 {
				t.Errorf("called again on the mutated pod, Mutate = %v, %v", patch, errs.ToAggregate())
			}
		})
	}
}

// TestMutateDefaultTopology: the cluster's rule (BFK's affinityRules on
// gpu.socket) reaches the request of a pod of several GPUs that names no
// link of its own; a pod's own, and a one-GPU pod, are left as they are.
func TestMutateDefaultTopology(t *testing.T) {
	c := config(kube.UnitPercent)
	c.DefaultTopology = "socket"
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"several GPUs, no link named", podOf(asking("bitfusion.io/gpu-amount=2")), `{"gpuAmount":2,"topology":"socket"}`},
		{"several GPUs, a link of its own", annotated(podOf(asking("bitfusion.io/gpu-amount=2")), kube.AnnotationTopology, "nvlink"), `{"gpuAmount":2,"topology":"nvlink"}`},
		{"one GPU", podOf(asking("bitfusion.io/gpu-amount=1", "bitfusion.io/gpu-percent=50")), `{"gpuAmount":1,"gpuPercent":50}`},
	} {
		if got := mutate(t, c, tc.pod).Annotations[kube.AnnotationRequest]; got != tc.want {
			t.Errorf("%s: request %s, want %s", tc.name, got, tc.want)
		}
	}
	c.DefaultTopology = "any"
	if got := mutate(t, c, podOf(asking("bitfusion.io/gpu-amount=2"))).Annotations[kube.AnnotationRequest]; got != `{"gpuAmount":2}` {
		t.Errorf("default any: request %s, want no topology", got)
	}
}

func TestMutateWhereTheRequestIs(t *testing.T) {
	c := config(kube.UnitPercent)
	t.Run("requests only", func(t *testing.T) {
		ctr := corev1.Container{Name: "c", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
			kube.ResourceGPUAmount: resource.MustParse("1"), kube.ResourceGPUPercent: resource.MustParse("25")}}}
		res := mutate(t, c, podOf(ctr)).Spec.Containers[0].Resources
		want := corev1.ResourceList{kube.ResourceGPU: resource.MustParse("25")}
		if !equality.Semantic.DeepEqual(res.Limits, want) || !equality.Semantic.DeepEqual(res.Requests, want) {
			t.Errorf("resources = %v, want %v in requests and limits", res, want)
		}
	})
	t.Run("an init container", func(t *testing.T) {
		p := podOf(corev1.Container{Name: "main"})
		p.Spec.InitContainers = []corev1.Container{asking("bitfusion.io/gpu-amount=1")}
		patch, errs := c.Mutate(p)
		if len(errs) > 0 || patch[0].Path != "/spec/initContainers/0/resources" {
			t.Fatalf("Mutate = %v, %v", patch, errs.ToAggregate())
		}
		if got := apply(t, p, patch).Spec.InitContainers[0].Resources.Limits[kube.ResourceGPU]; got.Value() != 100 {
			t.Errorf("init container's bitfusion.io/gpu = %s", &got)
		}
	})
	t.Run("the second container, models, topology and BFK's annotations kept", func(t *testing.T) {
		p := annotated(podOf(corev1.Container{Name: "sidecar"}, asking("bitfusion.io/gpu-amount=1", "bitfusion.io/gpu-percent=50")),
			kube.AnnotationModels, "A100, H100", kube.AnnotationTopology, "nvlink", kube.AnnotationAutoManagement, "Yes", kube.AnnotationClientOS, "ubuntu20", kube.AnnotationClientVersion, "401")
		got := mutate(t, c, p)
		if r := got.Annotations[kube.AnnotationRequest]; r != `{"gpuAmount":1,"gpuPercent":50,"models":["A100","H100"],"topology":"nvlink"}` {
			t.Errorf("request = %s", r)
		}
		for k, v := range p.Annotations {
			if got.Annotations[k] != v {
				t.Errorf("annotation %s = %q, want %q kept", k, got.Annotations[k], v)
			}
		}
		if q := got.Spec.Containers[1].Resources.Limits[kube.ResourceGPU]; q.Value() != 50 {
			t.Errorf("containers[1] bitfusion.io/gpu = %s", &q)
		}
	})
}

func TestMutateLeavesAlone(t *testing.T) {
	c := config(kube.UnitPercent)
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
	}{
		{"no bitfusion.io resource", podOf(asking("nvidia.com/gpu=1"))},
	} {
		if patch, errs := c.Mutate(tc.pod); patch != nil || errs != nil {
			t.Errorf("%s: Mutate = %v, %v, want nothing", tc.name, patch, errs)
		}
	}
	t.Run("a normalised container and the scheduler name", func(t *testing.T) {
		c := Config{Unit: kube.UnitGPUs, GPUMemoryBytes: bfkGPUMemory}
		ctr := asking("bitfusion.io/gpu=2")
		ctr.Resources.Requests = corev1.ResourceList{kube.ResourceGPU: resource.MustParse("2")}
		p := podOf(ctr)
		p.Spec.SchedulerName = "default-scheduler"
		patch, errs := c.Mutate(p)
		if len(errs) > 0 || len(patch) != 1 || patch[0].Path != "/metadata/annotations" {
			t.Errorf("Mutate = %+v, %v: want the annotations alone", patch, errs)
		}
	})
}

// refusal is a pod the webhook refuses (testdata/refusals.yaml).
type refusal struct {
	Name   string     `json:"name"`
	Unit   kube.Unit  `json:"unit"`
	Pod    corev1.Pod `json:"pod"`
	Denied string     `json:"denied"`
}

func readRefusals(t *testing.T) []refusal {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "refusals.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rs []refusal
	if err := yaml.UnmarshalStrict(b, &rs); err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestRefusals: the webhook refuses each pod with its message, pods
// created marked as handled included, which it does not patch.
func TestRefusals(t *testing.T) {
	for _, tc := range readRefusals(t) {
		t.Run(tc.Name, func(t *testing.T) {
			patch, errs := config(tc.Unit).Mutate(&tc.Pod)
			if patch != nil || errs.ToAggregate() == nil || errs.ToAggregate().Error() != tc.Denied {
				t.Errorf("Mutate = %v,\n%v\nwant the refusal\n%s", patch, errs.ToAggregate(), tc.Denied)
			}
		})
	}
}

// TestMutateAdmitsMarked: a pod created marked as handled is admitted
// unpatched when it asks for what it records: the webhook called again on
// its own patch (reinvocation), or an admitted pod's manifest copied.
func TestMutateAdmitsMarked(t *testing.T) {
	c := config(kube.UnitPercent)
	for name, pod := range map[string]*corev1.Pod{
		"a normalised pod":    mutate(t, c, podOf(asking("bitfusion.io/gpu-amount=1", "bitfusion.io/gpu-percent=50"))),
		"a pod asking none":   podOf(asking()),
		"marked, asking none": annotated(podOf(asking()), kube.AnnotationStatus, kube.StatusInjected),
	} {
		if patch, errs := c.Mutate(pod); patch != nil || errs != nil {
			t.Errorf("%s: Mutate = %v, %v", name, patch, errs.ToAggregate())
		}
	}
}

func TestParseGPUMemory(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  string
	}{
		{"16000", 16_000_000_000, ""},
		{"16000M", 16_000_000_000, ""},
		{"80Gi", 80 << 30, ""},
		{"16G", 16_000_000_000, ""},
		{"lots", 0, `"lots" is not a quantity (e.g. 8000, 8000M or 16Gi)`},
		{"1.5", 0, `"1.5" is not a whole number`},
		{"0", 0, `"0" is out of range 1..1Pi`},
		{"2Pi", 0, `"2Pi" is out of range 1..1Pi`},
		{"1Pi", 1 << 50, ""},
	} {
		got, err := ParseGPUMemory(tc.in)
		if got != tc.want || (err == nil) != (tc.err == "") || err != nil && err.Error() != tc.err {
			t.Errorf("ParseGPUMemory(%q) = %d, %v; want %d, %q", tc.in, got, err, tc.want, tc.err)
		}
	}
}

// TestMemoryPastItsRangeIsRefused: what a probe sent under a unit of
// memory (where no "less than one GPU's memory" check applies), each
// refused naming the field and the range, none admitted with a small
// bitfusion.io/gpu; testdata/refusals.yaml has the messages.
func TestMemoryPastItsRangeIsRefused(t *testing.T) {
	for _, limits := range [][]string{
		{"bitfusion.io/gpu-amount=64", "bitfusion.io/gpu-memory=288230376151711744"},
		{"bitfusion.io/gpu-amount=64", "bitfusion.io/gpu-memory=144115188075855872"},
		{"bitfusion.io/gpu-amount=2", "bitfusion.io/gpu-memory=9E"},
		{"bitfusion.io/gpu-amount=1", "bitfusion.io/gpu-memory=2e15"},
		{"bitfusion.io/gpu-amount=1", "bitfusion.io/gpu-memory=100E"},
		{"bitfusion.io/gpu-amount=100E", "bitfusion.io/gpu-memory=8Gi"},
		{"bitfusion.io/gpu=100E"},
	} {
		patch, errs := config(kube.MemoryUnit(8 << 30)).Mutate(podOf(asking(limits...)))
		if patch != nil || errs.ToAggregate() == nil || !strings.Contains(errs.ToAggregate().Error(), "must be 1..") {
			t.Errorf("%v: Mutate = %v, %v; want refused naming the range", limits, patch, errs.ToAggregate())
		}
	}
}

// TestTimesRefusesWhatWraps: a product past int64 is refused, naming the
// part, never wrapped into a small count.
func TestTimesRefusesWhatWraps(t *testing.T) {
	at := &part{value: 1 << 50, shown: "1Pi", path: atRequest.Child("gpuMemory")}
	if got, errs := times(at, 1<<50, 64, 100); errs != nil || got != 100<<56 {
		t.Errorf("times(2^50, 64, 100) = %d, %v; want 100 x 2^56", got, errs.ToAggregate())
	}
	for _, factors := range [][]int64{{1 << 50, 1 << 13}, {1 << 62, 2}, {3, 1 << 62}, {0, 5}, {-1, 5}} {
		_, errs := times(at, factors...)
		if errs.ToAggregate() == nil || !strings.Contains(errs.ToAggregate().Error(), `Invalid value: "1Pi": is out of range`) {
			t.Errorf("times%v = %v; want the refusal of gpuMemory", factors, errs.ToAggregate())
		}
	}
}
