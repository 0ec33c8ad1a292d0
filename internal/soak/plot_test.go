package soak

import (
	"bytes"
	"image"
	"image/png"
	"strings"
	"testing"
	"time"
)

func TestWriteCSV(t *testing.T) {
	var b strings.Builder
	if err := WriteCSV(&b, []Sample{{At: 90 * time.Second, Process: "sim-0", PID: 7, RSSBytes: 1 << 20, AnonBytes: 1 << 19, Goroutines: 12, LiveLeases: 3}}); err != nil {
		t.Fatal(err)
	}
	if want := "seconds,process,pid,rss_bytes,rss_anon_bytes,goroutines,live_leases\n90,sim-0,7,1048576,524288,12,3\n"; b.String() != want {
		t.Errorf("CSV:\n%s\nwant:\n%s", b.String(), want)
	}
}

// TestPlot: each process's series is drawn in its color, and the PNG has
// a panel for memory, goroutines and leases.
func TestPlot(t *testing.T) {
	samples := append(series("allocator", repeat[int64](40, 15), repeat(30, 15), repeat(5, 15)),
		series("sim-0", repeat[int64](20, 15), repeat(12, 15), repeat(5, 15))...)
	var b bytes.Buffer
	if err := Plot(&b, samples); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := img.Bounds(), image.Rect(0, 0, plotWidth, panelHeight*len(panels)); got != want {
		t.Errorf("bounds %v, want %v", got, want)
	}
	// Inside the first panel's plotting area, left of the legend, a
	// process's color is its line.
	area := image.Rect(marginLeft+1, marginTop, plotWidth-marginRight, panelHeight-marginBelow)
	for i, name := range []string{"allocator", "sim-0"} {
		if !hasColor(img, area, palette[i]) {
			t.Errorf("no line of %s's color in the memory panel", name)
		}
	}
	if hasColor(img, area, palette[2]) {
		t.Error("a third series in the memory panel, for two processes")
	}
	if err := Plot(&b, nil); err == nil {
		t.Error("no error plotting no samples")
	}
}

func hasColor(img image.Image, area image.Rectangle, c interface{ RGBA() (r, g, b, a uint32) }) bool {
	r0, g0, b0, _ := c.RGBA()
	for y := area.Min.Y; y < area.Max.Y; y++ {
		for x := area.Min.X; x < area.Max.X; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			if r == r0 && g == g0 && b == b0 {
				return true
			}
		}
	}
	return false
}

// TestLineReachesItsEnd: a line sets each pixel from one end to the
// other, one per row or column along its longer side, on any slope.
func TestLineReachesItsEnd(t *testing.T) {
	bounds := image.Rect(-10, -10, 10, 10)
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			end := image.Pt(x, y)
			img := image.NewRGBA(bounds)
			line(img, image.Point{}, end, ink)
			set := 0
			for py := bounds.Min.Y; py < bounds.Max.Y; py++ {
				for px := bounds.Min.X; px < bounds.Max.X; px++ {
					if img.RGBAAt(px, py) == ink {
						set++
					}
				}
			}
			if want := max(abs(end.X), abs(end.Y)) + 1; img.RGBAAt(end.X, end.Y) != ink || set != want {
				t.Errorf("line to %v: end set %v, %d pixels set, want %d", end, img.RGBAAt(end.X, end.Y) == ink, set, want)
			}
		}
	}
}
