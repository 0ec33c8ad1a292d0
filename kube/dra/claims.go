package dra

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/kube"
)

// Catalog is what a claim is read against: the pool's GPU models, each
// with the most memory a GPU of it has.
type Catalog map[string]int64

// CatalogOf is the catalog of the servers' healthy GPUs.
func CatalogOf(servers []api.ServerStatus) Catalog {
	c := Catalog{}
	for _, s := range servers {
		for _, g := range s.GPUs {
			if g.Healthy {
				c[g.Model] = max(c[g.Model], g.MemoryBytes)
			}
		}
	}
	return c
}

// Parameters are a claim's opaque configuration for the pool's driver
// (spec.devices.config[].opaque.parameters): Percent, the share of each
// GPU (1..100), where capacity.requests.memory asks by memory instead.
// DRA's own allocator has no percent: it reads only the capacity.
type Parameters struct {
	Percent int `json:"percent,omitempty"`
}

// Claim is a claim for the pool's GPUs as the pool places it: the one
// request of the claim (Name), as the pool's request.
type Claim struct {
	Name    string
	Request kube.Request
}

// ReadClaim reads claim against the catalog. ok is false for a claim
// that asks for none of the pool's devices, which is DRA's own to
// allocate. A claim that asks for them as the pool cannot place them is
// refused, naming the field, the value and the limit: the pool places
// one request of whole GPUs by count, or of a share of each by memory or
// percent, of the models its CEL selectors match.
func ReadClaim(ctx context.Context, claim *resourceapi.ResourceClaim, cat Catalog) (c Claim, ok bool, err error) {
	requests := field.NewPath("spec", "devices", "requests")
	var ours []int
	for i, r := range claim.Spec.Devices.Requests {
		if asksForOurs(r) {
			ours = append(ours, i)
		}
	}
	switch {
	case len(ours) == 0:
		return Claim{}, false, nil
	case len(claim.Spec.Devices.Requests) > 1:
		return Claim{}, true, field.Invalid(requests, len(claim.Spec.Devices.Requests),
			"a claim for "+DeviceClassName+" devices has one request, which the pool places as one lease: ask for other devices in a claim of their own")
	}
	r := claim.Spec.Devices.Requests[0]
	path := requests.Index(0)
	if r.Exactly == nil {
		return Claim{}, true, field.Forbidden(path.Child("firstAvailable"), "the pool places one request of "+DeviceClassName+": list no alternatives")
	}
	x, path := r.Exactly, path.Child("exactly")
	c = Claim{Name: r.Name}
	switch {
	case x.AllocationMode == resourceapi.DeviceAllocationModeAll:
		return Claim{}, true, field.NotSupported(path.Child("allocationMode"), x.AllocationMode, []resourceapi.DeviceAllocationMode{resourceapi.DeviceAllocationModeExactCount})
	case x.Count < 1 || x.Count > allocator.MaxGPUsPerServer:
		return Claim{}, true, field.Invalid(path.Child("count"), x.Count, fmt.Sprintf("must be 1..%d GPUs, all on one server", allocator.MaxGPUsPerServer))
	case ptr.Deref(x.AdminAccess, false):
		return Claim{}, true, field.Forbidden(path.Child("adminAccess"), "the pool's GPUs are leased, never shared with an admin's claim")
	}
	c.Request.GPUAmount = int(x.Count)
	if c.Request.Models, err = models(ctx, x.Selectors, path.Child("selectors"), cat); err != nil {
		return Claim{}, true, err
	}
	if x.Capacity != nil {
		for name, q := range x.Capacity.Requests {
			if name != CapacityMemory {
				return Claim{}, true, field.NotSupported(path.Child("capacity", "requests").Key(string(name)), string(name), []string{CapacityMemory})
			}
			most := mostMemory(cat, c.Request.Models)
			if v, ok := q.AsInt64(); !ok || v < MinMemory || v > most {
				return Claim{}, true, field.Invalid(path.Child("capacity", "requests").Key(CapacityMemory), q.String(),
					fmt.Sprintf("must be %s..%s of a GPU's memory (the most a GPU of the models asked has)", bytesOf(MinMemory), bytesOf(most)))
			}
			c.Request.GPUMemory = strconv.FormatInt(q.Value(), 10)
		}
	}
	if c.Request.GPUPercent, err = percent(claim.Spec.Devices.Config, r.Name); err != nil {
		return Claim{}, true, err
	}
	if c.Request.GPUPercent != 0 && c.Request.GPUMemory != "" {
		return Claim{}, true, field.Invalid(path.Child("capacity", "requests").Key(CapacityMemory), c.Request.GPUMemory,
			"a share is by memory or by percent (the configuration's percent), not both")
	}
	if c.Request.Topology, err = topology(claim.Spec.Devices.Constraints); err != nil {
		return Claim{}, true, err
	}
	return c, true, nil
}

// asksForOurs reports whether a request asks for the pool's class, or for
// it among alternatives.
func asksForOurs(r resourceapi.DeviceRequest) bool {
	if r.Exactly != nil {
		return r.Exactly.DeviceClassName == DeviceClassName
	}
	return slices.ContainsFunc(r.FirstAvailable, func(s resourceapi.DeviceSubRequest) bool { return s.DeviceClassName == DeviceClassName })
}

// models are the catalog's models whose devices the selectors match, all
// of them for none; a selector that reads more than a device's model and
// memory, which the pool does not place by, is refused.
func models(ctx context.Context, selectors []resourceapi.DeviceSelector, path *field.Path, cat Catalog) ([]string, error) {
	if len(selectors) == 0 {
		return nil, nil
	}
	compiled := make([]cel.CompilationResult, len(selectors))
	for i, s := range selectors {
		if s.CEL == nil {
			return nil, field.Required(path.Index(i).Child("cel"), "the pool reads CEL selectors only")
		}
		compiled[i] = cel.GetCompiler(cel.Features{EnableConsumableCapacity: true}).CompileCELExpression(s.CEL.Expression, cel.Options{})
		if compiled[i].Error != nil {
			return nil, field.Invalid(path.Index(i).Child("cel", "expression"), s.CEL.Expression, compiled[i].Error.Error())
		}
	}
	var matched []string
	for _, model := range slices.Sorted(maps.Keys(cat)) {
		device := cel.Device{Driver: DriverName, AllowMultipleAllocations: ptr.To(true),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{AttributeModel: {StringValue: ptr.To(model)}},
			Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{CapacityMemory: {Value: *resource.NewQuantity(cat[model], resource.BinarySI)}}}
		all := true
		for i, s := range selectors {
			match, _, err := compiled[i].DeviceMatches(ctx, device)
			if err != nil {
				return nil, field.Invalid(path.Index(i).Child("cel", "expression"), s.CEL.Expression,
					fmt.Sprintf("the pool places by a GPU's %s and %s only: %v", AttributeModel, CapacityMemory, err))
			}
			all = all && match
		}
		if all {
			matched = append(matched, model)
		}
	}
	if len(matched) == 0 {
		return nil, field.Invalid(path, selectorsText(selectors), fmt.Sprintf("no GPU model of the pool matches (it has %v)", slices.Sorted(maps.Keys(cat))))
	}
	return matched, nil
}

func selectorsText(selectors []resourceapi.DeviceSelector) string {
	var texts []string
	for _, s := range selectors {
		if s.CEL != nil {
			texts = append(texts, s.CEL.Expression)
		}
	}
	b, _ := json.Marshal(texts)
	return string(b)
}

// mostMemory is the most memory a GPU of the models has, of all the
// catalog's for none.
func mostMemory(cat Catalog, models []string) int64 {
	var most int64
	for model, memory := range cat {
		if len(models) == 0 || slices.Contains(models, model) {
			most = max(most, memory)
		}
	}
	return most
}

// percent is the percent the claim's configuration for the pool's driver
// gives request, 0 for none.
func percent(configs []resourceapi.DeviceClaimConfiguration, request string) (int, error) {
	got := 0
	for i, c := range configs {
		if c.Opaque == nil || c.Opaque.Driver != DriverName || (len(c.Requests) > 0 && !slices.Contains(c.Requests, request)) {
			continue
		}
		path := field.NewPath("spec", "devices", "config").Index(i).Child("opaque", "parameters")
		var p Parameters
		dec := json.NewDecoder(bytes.NewReader(c.Opaque.Parameters.Raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			return 0, field.Invalid(path, string(c.Opaque.Parameters.Raw), fmt.Sprintf(`want {"percent": 1..100}: %v`, err))
		}
		if p.Percent < 1 || p.Percent > 100 {
			return 0, field.Invalid(path.Child("percent"), p.Percent, "must be 1..100 of each GPU")
		}
		got = p.Percent
	}
	return got, nil
}

// topology is the least link the claim's constraints ask between its
// GPUs: nvlink for GPUs that match on nvlinkGroup.
func topology(constraints []resourceapi.DeviceConstraint) (string, error) {
	t := ""
	for i, c := range constraints {
		path := field.NewPath("spec", "devices", "constraints").Index(i)
		if c.MatchAttribute == nil || *c.MatchAttribute != DriverName+"/"+AttributeNVLinkGroup {
			return "", field.NotSupported(path.Child("matchAttribute"), ptr.Deref(c.MatchAttribute, ""), []string{DriverName + "/" + AttributeNVLinkGroup})
		}
		t = "nvlink"
	}
	return t, nil
}

func bytesOf(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }
