// Package simulate replays GPU cluster traces against the allocator's
// placement policies with the protocol of the FGD paper (Weng et al.,
// "Beware of Fragmentation", USENIX ATC'23), so that policies can be
// compared with each other and with the paper's published figures.
package simulate

import (
	"embed"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/inventory"
)

// Traces holds the Alibaba OpenB traces (cluster-trace-gpu-v2023) so that
// `gpupool-simulate` runs with no files at hand.
//
//go:embed traces/*.csv
var Traces embed.FS

// Trace files within Traces.
const (
	DefaultNodes   = "traces/openb_node_list_gpu_node.csv"
	DefaultPods    = "traces/openb_pod_list_default.csv"
	GPUShare40Pods = "traces/openb_pod_list_gpushare40.csv"
	GPUSpec10Pods  = "traces/openb_pod_list_gpuspec10.csv"
	MultiGPU20Pods = "traces/openb_pod_list_multigpu20.csv"
)

// PodLists are the embedded pod lists, the FGD paper's four traces.
var PodLists = []string{DefaultPods, GPUShare40Pods, GPUSpec10Pods, MultiGPU20Pods}

const mib = 1 << 20

// maxPodGPUs bounds GPU counts in traces (a server holds at most 64).
const maxPodGPUs = 64

// Pod is one task of a trace.
type Pod struct {
	Name     string
	CPUMilli int64
	Memory   int64 // bytes
	GPUs     int
	PerGPU   allocator.Share // share of each GPU
	Models   []string        // allowed GPU models; empty means any
}

// GPUShare is the GPU share the pod asks for in all.
func (p *Pod) GPUShare() allocator.Share { return allocator.Share(p.GPUs) * p.PerGPU }

// Open reads a trace file from disk, or from the embedded traces when the
// name starts with "traces/" and no such file exists on disk. A name that
// is neither is an fs.ErrNotExist that lists the embedded traces.
func Open(name string) (io.ReadCloser, error) {
	f, err := os.Open(name) //nolint:gosec // reading the trace the user named is the point
	if err == nil {
		return f, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if embedded, eerr := Traces.Open(name); eerr == nil {
		return embedded, nil
	}
	names, _ := fs.Glob(Traces, "traces/*.csv") // the pattern is valid
	return nil, fmt.Errorf("%w; the embedded traces are %s", err, strings.Join(names, ", "))
}

// LoadTrace reads a node list and a pod list, each opened as Open does.
func LoadTrace(nodesFile, podsFile string) (*Trace, error) {
	var tr Trace
	if err := readFile(nodesFile, func(r io.Reader) (err error) { tr.Servers, err = ReadNodes(r); return err }); err != nil {
		return nil, err
	}
	if err := readFile(podsFile, func(r io.Reader) (err error) { tr.Pods, err = ReadPods(r); return err }); err != nil {
		return nil, err
	}
	return &tr, nil
}

// readFile opens name as Open does and reads it; an error names the file.
func readFile(name string, read func(io.Reader) error) error {
	f, err := Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := read(f); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// ReadNodes reads an OpenB node list (sn,cpu_milli,memory_mib,gpu,model).
func ReadNodes(r io.Reader) ([]inventory.Server, error) {
	var servers []inventory.Server
	err := readCSV(r, []string{"sn", "cpu_milli", "memory_mib", "gpu", "model"}, func(row rowReader) error {
		s := inventory.Server{Name: row.str("sn"), CPUMilli: row.int("cpu_milli"), MemoryBytes: row.int("memory_mib") * mib}
		gpus, model := row.int("gpu"), row.str("model")
		switch {
		case row.err != nil:
			return row.err
		case gpus < 0 || gpus > maxPodGPUs:
			return fmt.Errorf("gpu %d out of range 0..%d", gpus, maxPodGPUs)
		case gpus > 0 && model == "":
			return fmt.Errorf("model is empty for a node with %d GPUs", gpus)
		case s.CPUMilli < 0 || s.MemoryBytes < 0:
			return fmt.Errorf("cpu_milli %d and memory_mib %d must be at least 0", s.CPUMilli, s.MemoryBytes/mib)
		}
		for i := range int(gpus) {
			s.GPUs = append(s.GPUs, inventory.GPU{
				Index: i, UUID: fmt.Sprintf("GPU-%s-%d", s.Name, i), Model: model, Healthy: true,
			})
		}
		servers = append(servers, s)
		return nil
	})
	return servers, err
}

// ReadPods reads an OpenB pod list (name,cpu_milli,memory_mib,num_gpu,
// gpu_milli[,gpu_spec,...]); gpu_spec is a '|'-separated list of models.
func ReadPods(r io.Reader) ([]Pod, error) {
	var pods []Pod
	err := readCSV(r, []string{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"}, func(row rowReader) error {
		gpus, milli := row.int("num_gpu"), row.int("gpu_milli")
		p := Pod{Name: row.str("name"), CPUMilli: row.int("cpu_milli"), Memory: row.int("memory_mib") * mib}
		if spec := row.str("gpu_spec"); spec != "" {
			p.Models = strings.Split(spec, "|")
		}
		switch {
		case row.err != nil:
			return row.err
		case gpus < 0 || gpus > maxPodGPUs:
			return fmt.Errorf("num_gpu %d out of range 0..%d", gpus, maxPodGPUs)
		case gpus > 0 && (milli < 1 || allocator.Share(milli) > allocator.WholeGPU):
			return fmt.Errorf("gpu_milli %d out of range 1..%d", milli, allocator.WholeGPU)
		case p.CPUMilli < 0 || p.Memory < 0:
			return fmt.Errorf("cpu_milli %d and memory_mib %d must be at least 0", p.CPUMilli, p.Memory/mib)
		}
		p.GPUs, p.PerGPU = int(gpus), allocator.Share(milli)
		pods = append(pods, p)
		return nil
	})
	return pods, err
}

// rowReader reads the fields of one CSV row by column name, keeping the
// first error so a row is checked once at its end.
type rowReader struct {
	cols   map[string]int
	fields []string
	err    error
}

func (r *rowReader) str(col string) string {
	i, ok := r.cols[col]
	if !ok || i >= len(r.fields) {
		return ""
	}
	return r.fields[i]
}

func (r *rowReader) int(col string) int64 {
	v, err := strconv.ParseInt(r.str(col), 10, 64)
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("column %s: %q is not an integer", col, r.str(col))
	}
	return v
}

func readCSV(r io.Reader, required []string, each func(rowReader) error) error {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	header, err := cr.Read()
	if err != nil {
		return fmt.Errorf("reading header: %w", err)
	}
	cols := map[string]int{}
	for i, h := range header {
		cols[strings.TrimSpace(h)] = i
	}
	for _, c := range required {
		if _, ok := cols[c]; !ok {
			return fmt.Errorf("header %q lacks column %s", strings.Join(header, ","), c)
		}
	}
	for line := 2; ; line++ {
		fields, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := each(rowReader{cols: cols, fields: fields}); err != nil {
			return fmt.Errorf("line %d: %w", line, err)
		}
	}
}

// WritePods writes pods as an OpenB pod list that ReadPods reads back
// (name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec).
func WritePods(w io.Writer, pods []Pod) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"}) // errors stay in cw
	for _, p := range pods {
		_ = cw.Write([]string{p.Name, strconv.FormatInt(p.CPUMilli, 10), strconv.FormatInt(p.Memory/mib, 10),
			strconv.Itoa(p.GPUs), strconv.FormatInt(int64(p.PerGPU), 10), strings.Join(p.Models, "|")})
	}
	cw.Flush()
	return cw.Error()
}
