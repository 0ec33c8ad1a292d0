package admission

import (
	"flag"
	"fmt"

	"github.com/gpupool/gpupool/kube"
)

// UnitFlags are the cluster's bitfusion.io settings, which every binary
// that reads or writes bitfusion.io/gpu takes the same: --unit (Config.Unit)
// and, where bitfusion.io/gpu-memory counts too, --gpu-memory
// (Config.GPUMemoryBytes). Validate parses them into Unit and
// GPUMemoryBytes.
type UnitFlags struct {
	UnitName, GPUMemory string

	// Unit and GPUMemoryBytes are UnitName and GPUMemory, parsed by
	// Validate.
	Unit           kube.Unit
	GPUMemoryBytes int64
}

// NewUnitFlags returns the defaults: BFK's unit and GPU memory.
func NewUnitFlags() UnitFlags {
	return UnitFlags{UnitName: string(kube.UnitPercent), GPUMemory: DefaultGPUMemory}
}

// AddFlags registers --unit and --gpu-memory on fs, each with its help,
// which says what the binary does with it.
func (u *UnitFlags) AddFlags(fs *flag.FlagSet, unitUsage, memoryUsage string) {
	u.AddUnitFlag(fs, unitUsage)
	fs.StringVar(&u.GPUMemory, "gpu-memory", u.GPUMemory, memoryUsage)
}

// AddUnitFlag registers --unit alone on fs, for a binary that counts
// bitfusion.io/gpu but no GPU memory (the device plugin); it validates
// with ValidateUnit.
func (u *UnitFlags) AddUnitFlag(fs *flag.FlagSet, usage string) {
	fs.StringVar(&u.UnitName, "unit", u.UnitName, usage)
}

// Validate parses --unit and --gpu-memory, each error naming its flag.
func (u *UnitFlags) Validate() error {
	if err := u.ValidateUnit(); err != nil {
		return err
	}
	memory, err := ParseGPUMemory(u.GPUMemory)
	if err != nil {
		return fmt.Errorf("--gpu-memory: %w", err)
	}
	u.GPUMemoryBytes = memory
	return nil
}

// ValidateUnit parses --unit alone.
func (u *UnitFlags) ValidateUnit() error {
	unit, err := kube.ParseUnit(u.UnitName)
	if err != nil {
		return fmt.Errorf("--unit: %w", err)
	}
	u.Unit = unit
	return nil
}
