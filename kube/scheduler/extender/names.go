package extender

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/internal/jsonscan"
	"github.com/gpupool/gpupool/kube/scheduler"
)

// filterArgs is kube-scheduler's extenderv1.ExtenderArgs as the filter
// reads it, in one pass over the call: of the pod only whose it is, since
// the filter acts on the pod as kube-apiserver has it, never as the call
// describes it; the candidate names into a slice kept between calls, each
// name as the string decoded for it before. The same thousand names come
// with every pod; a string each per call would be most of what a call
// allocates. Whole nodes (Nodes), which a kube-scheduler configured with
// nodeCacheCapable: false sends instead of names, are skipped unread: the
// filter refuses the call for want of names.
type filterArgs struct {
	Pod       *scheduler.PodRef
	NodeNames nodeNames
}

// UnmarshalJSON reads the call, which must be valid JSON (decode checks).
// Keys match as encoding/json matches them, in any case.
func (a *filterArgs) UnmarshalJSON(data []byte) error {
	s := jsonscan.New(data)
	ok, err := s.Object(func(key string) error {
		switch {
		case strings.EqualFold(key, "pod"):
			return a.readPod(s)
		case strings.EqualFold(key, "nodenames"):
			return a.NodeNames.UnmarshalJSON(s.Value())
		}
		s.Skip()
		return nil
	})
	if !ok {
		return errors.New("the call is not a JSON object")
	}
	return err
}

// readPod reads the pod's metadata.namespace, name and uid.
func (a *filterArgs) readPod(s *jsonscan.Scanner) error {
	if s.Literal("null") {
		a.Pod = nil
		return nil
	}
	a.Pod = &scheduler.PodRef{}
	ok, err := s.Object(func(key string) error {
		if !strings.EqualFold(key, "metadata") {
			s.Skip()
			return nil
		}
		_, err := s.Object(func(key string) error {
			var field *string
			switch {
			case strings.EqualFold(key, "namespace"):
				field = &a.Pod.Namespace
			case strings.EqualFold(key, "name"):
				field = &a.Pod.Name
			case strings.EqualFold(key, "uid"):
				field = (*string)(&a.Pod.UID)
			default:
				s.Skip()
				return nil
			}
			return readString(s, "pod.metadata."+key, field)
		})
		return err
	})
	if !ok {
		return errors.New("pod: not an object")
	}
	return err
}

// readString reads a string, or null (""), into v.
func readString(s *jsonscan.Scanner, path string, v *string) error {
	if s.Literal("null") {
		*v = ""
		return nil
	}
	raw, ok := s.Str()
	if !ok {
		return fmt.Errorf("%s: not a string", path)
	}
	var err error
	*v, err = jsonscan.Unquote(raw)
	return err
}

// nodeNames decodes a JSON array of node names.
type nodeNames struct {
	names []string
	// given is false when the call had no names (null, or none at all).
	given bool
	known *nameTable
}

// UnmarshalJSON reads the array, which must be valid JSON. Names with an escape or beyond ASCII, which no node name
// needs, take encoding/json's way.
func (n *nodeNames) UnmarshalJSON(data []byte) error {
	n.names, n.given = n.names[:0], false
	switch {
	case string(data) == "null":
		return nil
	case data[0] != '[':
		return errNotNames
	case !plainASCII(data):
		// Escapes (\u0061 is "a") are valid JSON, if not what
		// kube-scheduler writes; a name beyond ASCII is no node name.
		n.given = true
		if err := json.Unmarshal(data, &n.names); err != nil {
			return err
		}
		for _, name := range n.names {
			if err := checkNodeName(name); err != nil {
				return err
			}
		}
		return n.checkCount()
	}
	n.known.mu.Lock()
	defer n.known.mu.Unlock()
	rest := skipSpace(data[1:])
	if rest[0] == ']' {
		n.given = true
		return nil
	}
	for {
		end := bytes.IndexByte(rest[1:], '"') + 1 // the closing quote
		if rest[0] != '"' || end == 0 {
			return errNotNames
		}
		name, err := n.known.intern(rest[1:end])
		if err != nil {
			return err
		}
		n.names = append(n.names, name)
		rest = skipSpace(rest[end+1:])
		switch rest[0] {
		case ',':
			rest = skipSpace(rest[1:])
		case ']':
			n.given = true
			return n.checkCount()
		default:
			return errNotNames
		}
	}
}

var errNotNames = errors.New("NodeNames is not an array of node names")

// checkCount refuses more names than the allocator takes.
func (n *nodeNames) checkCount() error {
	if len(n.names) > allocator.MaxServers {
		return fmt.Errorf("NodeNames: %d names, more than %d", len(n.names), allocator.MaxServers)
	}
	return nil
}

// checkNodeName refuses what kube-apiserver would not take as a node's
// name (a DNS-1123 subdomain), so that only names of real nodes are kept.
func checkNodeName(name string) error {
	errs := validation.IsDNS1123Subdomain(name)
	if len(errs) == 0 {
		return nil
	}
	shown := name
	if len(shown) > 64 {
		shown = shown[:64] + "..."
	}
	return fmt.Errorf("NodeNames: %q (%d bytes) is not a node name: %s", shown, len(name), errs[0])
}

// plainASCII reports whether b holds no escape and nothing beyond ASCII.
func plainASCII(b []byte) bool {
	for _, c := range b {
		if c == '\\' || c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

func skipSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r' || b[0] == '\n') {
		b = b[1:]
	}
	return b
}

// maxKnownNames bounds a nameTable: when nodes come and go for long
// enough to fill it, it starts over from the names of the next calls. With
// node names of at most 253 bytes it holds at most 17 MB of them.
const maxKnownNames = 1 << 16

// nameTable holds one string per node name seen.
type nameTable struct {
	mu    sync.Mutex
	names map[string]string
}

// intern is the string of name, which must be a node's name; the caller
// holds mu.
func (t *nameTable) intern(name []byte) (string, error) {
	if s, ok := t.names[string(name)]; ok { // converting to look up allocates nothing
		return s, nil
	}
	s := string(name)
	if err := checkNodeName(s); err != nil {
		return "", err
	}
	if t.names == nil || len(t.names) >= maxKnownNames {
		t.names = make(map[string]string)
	}
	t.names[s] = s
	return s, nil
}
