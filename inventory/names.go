package inventory

import (
	"regexp"
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/gpupool/gpupool/internal/fielderr"
)

// MaxNameLen bounds a GPU's UUID and model, as Kubernetes bounds names.
const MaxNameLen = 253

// uuidShape is what NVML names a device: GPU-<hex groups> or
// MIG-<hex groups>, or before driver 470 MIG-GPU-<uuid>/<gi>/<ci>; the
// simulated GPUs' GPU-sim-<server>-<index> has the first shape. A UUID
// goes into NVIDIA_VISIBLE_DEVICES, a comma-separated list, and names a
// file under a directory, so nothing else may pass: no comma, no space,
// no control byte, no ".." path element.
var uuidShape = regexp.MustCompile(`^(GPU|MIG)-[0-9A-Za-z][0-9A-Za-z._-]*$|^MIG-GPU-[0-9A-Za-z][0-9A-Za-z._-]*/[0-9]{1,4}/[0-9]{1,4}$`)

// ValidateUUID checks a GPU's UUID as field.
func ValidateUUID(field, uuid string) error {
	switch {
	case len(uuid) > MaxNameLen:
		return &fielderr.Error{Field: field, Value: quote(uuid), Limit: "longer than " + strconv.Itoa(MaxNameLen) + " characters"}
	case !uuidShape.MatchString(uuid):
		return &fielderr.Error{Field: field, Value: quote(uuid), Limit: "is not a GPU UUID as NVML gives it: GPU-<letters, digits, . _ ->, MIG-<the same>, or MIG-GPU-<the same>/<gi>/<ci>"}
	}
	return nil
}

// ValidateModel checks a GPU's model as field: printable text, which the
// console, the CLI and the metrics' labels show as it is.
func ValidateModel(field, model string) error {
	switch {
	case model == "" || len(model) > MaxNameLen:
		return &fielderr.Error{Field: field, Value: quote(model), Limit: "must be 1.." + strconv.Itoa(MaxNameLen) + " characters"}
	case !printable(model):
		return &fielderr.Error{Field: field, Value: quote(model), Limit: "must be printable text (no control or format characters)"}
	}
	return nil
}

// printable is true of valid UTF-8 made of letters, marks, numbers,
// punctuation, symbols and the ASCII space: no control byte, no
// bidirectional override (U+202E is a format character).
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// quote is a value as an error shows it: shortened, and escaped, so that a
// refusal logged or printed carries no terminal escape or line break.
func quote(s string) string { return strconv.QuoteToASCII(fielderr.Shorten(s)) }
