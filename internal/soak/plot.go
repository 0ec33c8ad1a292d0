package soak

import (
	"cmp"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"slices"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// The plot's geometry, in pixels: panels stacked, the legend on the right.
const (
	plotWidth   = 1100
	panelHeight = 260
	marginLeft  = 70
	marginRight = 190
	marginTop   = 28
	marginBelow = 34
	gridLines   = 5
)

// palette gives each process a color, in the order processes appear.
var palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, {0xd6, 0x27, 0x28, 0xff}, {0x2c, 0xa0, 0x2c, 0xff}, {0xff, 0x7f, 0x0e, 0xff},
	{0x94, 0x67, 0xbd, 0xff}, {0x8c, 0x56, 0x4b, 0xff}, {0xe3, 0x77, 0xc2, 0xff}, {0x17, 0xbe, 0xcf, 0xff},
}

var (
	ink  = color.RGBA{0x20, 0x20, 0x20, 0xff}
	grid = color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
)

// panel is one chart: a value of each sample over time.
type panel struct {
	title string
	value func(Sample) float64
	// pool draws one series for the whole pool (a value every process's
	// sample carries) instead of one per process.
	pool bool
}

var panels = []panel{
	{title: "resident memory (MiB)", value: func(s Sample) float64 { return float64(s.RSSBytes) / (1 << 20) }},
	{title: "goroutines", value: func(s Sample) float64 { return float64(s.Goroutines) }},
	{title: "live leases (the pool's)", value: func(s Sample) float64 { return float64(s.LiveLeases) }, pool: true},
}

// Plot draws the samples as a PNG: resident memory and goroutines of each
// process over time, and the pool's live leases, minutes along the
// bottom. The standard image packages and x/image's bitmap font draw it:
// a plotting library would bring a dozen modules for three line charts.
func Plot(w io.Writer, samples []Sample) error {
	if len(samples) == 0 {
		return errors.New("no samples to plot")
	}
	img := image.NewRGBA(image.Rect(0, 0, plotWidth, panelHeight*len(panels)))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	processes, series := byProcess(samples)
	end := slices.MaxFunc(samples, func(a, b Sample) int { return cmp.Compare(a.At, b.At) }).At.Minutes()
	for i, p := range panels {
		area := image.Rect(marginLeft, i*panelHeight+marginTop, plotWidth-marginRight, (i+1)*panelHeight-marginBelow)
		top := 0.0
		for _, s := range samples {
			top = math.Max(top, p.value(s))
		}
		top = niceCeiling(top)
		drawAxes(img, area, p.title, end, top)
		toPoint := func(s Sample) image.Point {
			return image.Pt(area.Min.X+int(s.At.Minutes()/math.Max(end, 1e-9)*float64(area.Dx())),
				area.Max.Y-int(p.value(s)/top*float64(area.Dy())))
		}
		if p.pool {
			drawSeries(img, series[processes[0]], toPoint, palette[0])
			continue
		}
		for j, name := range processes {
			c := palette[j%len(palette)]
			drawSeries(img, series[name], toPoint, c)
			y := i*panelHeight + marginTop + 16*j
			draw.Draw(img, image.Rect(plotWidth-marginRight+12, y, plotWidth-marginRight+24, y+10), image.NewUniform(c), image.Point{}, draw.Src)
			label(img, plotWidth-marginRight+30, y+10, name)
		}
	}
	return png.Encode(w, img)
}

// niceCeiling is the top of an axis over values up to v: 1, 2 or 5 times
// a power of ten, so that the grid lines fall on round numbers.
func niceCeiling(v float64) float64 {
	if v <= 0 {
		return 1
	}
	step := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*step >= v {
			return m * step
		}
	}
	return 10 * step
}

func drawAxes(img *image.RGBA, area image.Rectangle, title string, endMinutes, top float64) {
	for k := 0; k <= gridLines; k++ {
		y := area.Max.Y - k*area.Dy()/gridLines
		hline(img, area.Min.X, area.Max.X, y, grid)
		label(img, 4, y+4, fmt.Sprintf("%7.4g", top*float64(k)/gridLines))
		x := area.Min.X + k*area.Dx()/gridLines
		vline(img, x, area.Min.Y, area.Max.Y, grid)
		label(img, x-12, area.Max.Y+16, fmt.Sprintf("%.3g", endMinutes*float64(k)/gridLines))
	}
	hline(img, area.Min.X, area.Max.X, area.Max.Y, ink)
	vline(img, area.Min.X, area.Min.Y, area.Max.Y, ink)
	label(img, area.Min.X, area.Min.Y-8, title)
	label(img, area.Max.X-50, area.Max.Y+30, "minutes")
}

func drawSeries(img *image.RGBA, samples []Sample, toPoint func(Sample) image.Point, c color.RGBA) {
	for i := 1; i < len(samples); i++ {
		a, b := toPoint(samples[i-1]), toPoint(samples[i])
		line(img, a, b, c)
		line(img, a.Add(image.Pt(0, 1)), b.Add(image.Pt(0, 1)), c) // two pixels thick
	}
	if len(samples) == 1 {
		p := toPoint(samples[0])
		draw.Draw(img, image.Rect(p.X-2, p.Y-2, p.X+2, p.Y+2), image.NewUniform(c), image.Point{}, draw.Src)
	}
}

// line draws from a to b (Bresenham).
func line(img *image.RGBA, a, b image.Point, c color.RGBA) {
	dx, dy := abs(b.X-a.X), -abs(b.Y-a.Y)
	sx, sy := sign(b.X-a.X), sign(b.Y-a.Y)
	e := dx + dy
	for {
		img.SetRGBA(a.X, a.Y, c)
		if a == b {
			return
		}
		// Both steps test the error as it was before either.
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			a.X += sx
		}
		if e2 <= dx {
			e += dx
			a.Y += sy
		}
	}
}

func hline(img *image.RGBA, x0, x1, y int, c color.RGBA) {
	line(img, image.Pt(x0, y), image.Pt(x1, y), c)
}

func vline(img *image.RGBA, x, y0, y1 int, c color.RGBA) {
	line(img, image.Pt(x, y0), image.Pt(x, y1), c)
}

func abs(v int) int { return max(v, -v) }

func sign(v int) int {
	switch {
	case v > 0:
		return 1
	case v < 0:
		return -1
	}
	return 0
}

// label writes s with its baseline at (x, y).
func label(img *image.RGBA, x, y int, s string) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(ink), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}
