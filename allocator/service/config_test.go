package service

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

func TestQuotaBounds(t *testing.T) {
	for _, tc := range []struct {
		hard    string
		refused bool
	}{
		{"400", false},
		{"0", false},
		{"-1", true},
		{"1500m", true},
		{"1e18", true}, // would overflow the share
	} {
		c := &FileConfig{Namespaces: map[string]NamespaceConfig{
			"ml": {Hard: map[string]resource.Quantity{QuotaResource: resource.MustParse(tc.hard)}},
		}}
		err := c.validate()
		if (err != nil) != tc.refused {
			t.Errorf("quota %s: %v, want refused %v", tc.hard, err, tc.refused)
			continue
		}
		if err == nil {
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "namespaces.ml.hard."+QuotaResource) || !strings.Contains(msg, "0..100000000") {
			t.Errorf("quota %s: %q does not name the field and the limit", tc.hard, err)
		}
	}
}
