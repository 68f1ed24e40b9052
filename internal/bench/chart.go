package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"time"

	"golang.org/x/image/font"
	"golang.org/x/image/font/gofont/goregular"
	"golang.org/x/image/font/opentype"
	"golang.org/x/image/math/fixed"
)

// The report's charts, drawn with the standard library's image packages; golang.org/x/image
// supplies only the text (the Go font and its rasterizer).

var pathColor = map[PathName]color.RGBA{
	Direct:          {0x80, 0x80, 0x80, 0xff},
	Pass:            {0x1f, 0x77, 0xb4, 0xff},
	Decode:          {0xff, 0x7f, 0x0e, 0xff},
	HAProxy:         {0x94, 0x67, 0xbd, 0xff},
	WatchsanRepair:  {0x2c, 0xa0, 0x2c, 0xff},
	WatchsanObserve: {0x98, 0xdf, 0x8a, 0xff},
	WatchsanShare:   {0x17, 0xbe, 0xcf, 0xff},
	Frames:          {0x8c, 0x56, 0x4b, 0xff},
}

var (
	colBlack = color.RGBA{0x20, 0x20, 0x20, 0xff}
	colGrid  = color.RGBA{0xe0, 0xe0, 0xe0, 0xff}
	colAxis  = color.RGBA{0x60, 0x60, 0x60, 0xff}
	colWhite = color.RGBA{0xff, 0xff, 0xff, 0xff}
)

type canvas struct {
	img         *image.RGBA
	face, small font.Face
}

func newCanvas(w, h int) (*canvas, error) {
	f, err := opentype.Parse(goregular.TTF)
	if err != nil {
		return nil, err
	}
	face, err := opentype.NewFace(f, &opentype.FaceOptions{Size: 13, DPI: 72, Hinting: font.HintingFull})
	if err != nil {
		return nil, err
	}
	small, err := opentype.NewFace(f, &opentype.FaceOptions{Size: 11, DPI: 72, Hinting: font.HintingFull})
	if err != nil {
		return nil, err
	}
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), &image.Uniform{colWhite}, image.Point{}, draw.Src)
	return &canvas{img: img, face: face, small: small}, nil
}

func (c *canvas) rect(x0, y0, x1, y1 int, col color.Color) {
	draw.Draw(c.img, image.Rect(x0, y0, x1, y1), &image.Uniform{col}, image.Point{}, draw.Over)
}

// line draws a line w pixels wide.
func (c *canvas) line(x0, y0, x1, y1 float64, w int, col color.Color) {
	n := int(math.Max(math.Abs(x1-x0), math.Abs(y1-y0))) + 1
	for i := 0; i <= n; i++ {
		t := float64(i) / float64(n)
		x, y := int(x0+(x1-x0)*t+0.5), int(y0+(y1-y0)*t+0.5)
		c.rect(x-w/2, y-w/2, x-w/2+w, y-w/2+w, col)
	}
}

type align int

const (
	left align = iota
	center
	right
)

// text draws s with its baseline at y.
func (c *canvas) text(x, y int, s string, col color.Color, a align, small bool) {
	face := c.face
	if small {
		face = c.small
	}
	d := &font.Drawer{Dst: c.img, Src: &image.Uniform{col}, Face: face}
	w := d.MeasureString(s).Round()
	switch a {
	case center:
		x -= w / 2
	case right:
		x -= w
	}
	d.Dot = fixed.P(x, y)
	d.DrawString(s)
}

func (c *canvas) save(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, c.img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// legend draws one swatch and name per path in a row from (x, y).
func (c *canvas) legend(x, y int, paths []PathName) {
	names := make([]string, len(paths))
	cols := make([]color.RGBA, len(paths))
	for i, p := range paths {
		names[i], cols[i] = string(p), pathColor[p]
	}
	c.legendOf(x, y, names, cols)
}

// legendOf draws one swatch of cols[i] and names[i] each in a row from (x, y).
func (c *canvas) legendOf(x, y int, names []string, cols []color.RGBA) {
	for i, n := range names {
		c.rect(x, y-10, x+12, y+2, cols[i])
		c.text(x+16, y, n, colBlack, left, false)
		x += 16 + font.MeasureString(c.face, n).Round() + 18
	}
}

// si formats v with a k/M suffix.
func si(v float64) string {
	switch {
	case v >= 1e6:
		return trimZero(fmt.Sprintf("%.1f", v/1e6)) + "M"
	case v >= 1e3:
		return trimZero(fmt.Sprintf("%.1f", v/1e3)) + "k"
	}
	return trimZero(fmt.Sprintf("%.1f", v))
}

func trimZero(s string) string {
	if len(s) > 2 && s[len(s)-2:] == ".0" {
		return s[:len(s)-2]
	}
	return s
}

// logRange returns the decades that enclose vs (positive values only).
func logRange(vs []float64) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, v := range vs {
		if v > 0 {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	if math.IsInf(lo, 1) {
		return 1, 10
	}
	lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
	if lo == hi {
		hi *= 10
	}
	return lo, hi
}

// presentPaths lists the paths that have results, in report order.
func presentPaths(has func(PathName) bool) []PathName {
	var out []PathName
	for _, p := range knownPaths {
		if has(p) {
			out = append(out, p)
		}
	}
	return out
}

// throughputChart: events/s at saturation, one group of bars per workload, log scale.
func throughputChart(path string, res *Results) error {
	var keys []string
	by := map[string]map[PathName]float64{}
	var all []float64
	for _, t := range res.Throughput {
		k := t.Key()
		if by[k] == nil {
			by[k] = map[PathName]float64{}
			keys = append(keys, k)
		}
		by[k][t.Path] = t.EventsPerSec
		all = append(all, t.EventsPerSec)
	}
	paths := presentPaths(func(p PathName) bool {
		for _, m := range by {
			if _, ok := m[p]; ok {
				return true
			}
		}
		return false
	})
	if len(keys) == 0 {
		return nil
	}
	const barH, gap, leftM, rightM, topM, botM, width = 9, 14, 150, 40, 70, 50, 900
	h := topM + botM + len(keys)*(len(paths)*barH+gap)
	c, err := newCanvas(width, h)
	if err != nil {
		return err
	}
	c.text(width/2, 22, "Watch events per second at saturation (median; log scale)", colBlack, center, false)
	c.legend(leftM, 48, paths)
	lo, hi := logRange(all)
	plotW := width - leftM - rightM
	xOf := func(v float64) int {
		if v <= lo {
			return leftM
		}
		return leftM + int(float64(plotW)*math.Log10(v/lo)/math.Log10(hi/lo))
	}
	plotBottom := h - botM
	for d := lo; d <= hi*1.0001; d *= 10 {
		x := xOf(d)
		c.rect(x, topM-6, x+1, plotBottom, colGrid)
		c.text(x, plotBottom+16, si(d), colAxis, center, true)
	}
	c.text(leftM+plotW/2, plotBottom+38, "events/s", colAxis, center, false)
	y := topM
	for _, k := range keys {
		c.text(leftM-8, y+len(paths)*barH/2+5, k, colBlack, right, false)
		for _, p := range paths {
			if v, ok := by[k][p]; ok && v > 0 {
				c.rect(leftM, y, xOf(v), y+barH-1, pathColor[p])
			}
			y += barH
		}
		y += gap
	}
	c.rect(leftM, topM-6, leftM+1, plotBottom, colAxis)
	return c.save(path)
}

// latencyChart: latency percentiles by rate, one panel per percentile, log scale.
func latencyChart(path string, res *Results) error {
	if len(res.Latency) == 0 {
		return nil
	}
	var rates []float64
	seen := map[float64]bool{}
	var all []float64
	for _, l := range res.Latency {
		if !seen[l.Rate] {
			seen[l.Rate] = true
			rates = append(rates, l.Rate)
		}
		all = append(all, us(l.P50), us(l.P99), us(l.P999))
	}
	paths := presentPaths(func(p PathName) bool {
		for _, l := range res.Latency {
			if l.Path == p {
				return true
			}
		}
		return false
	})
	const width, height, topM, botM, leftM, panelGap = 1050, 430, 80, 60, 70, 30
	c, err := newCanvas(width, height)
	if err != nil {
		return err
	}
	c.text(width/2, 22, fmt.Sprintf("Latency from upstream write to client read, %d watches (median of runs; log scale)", res.Latency[0].Watches), colBlack, center, false)
	c.legend(leftM, 50, paths)
	lo, hi := logRange(all)
	panelW := (width - leftM - 20 - 2*panelGap) / 3
	plotBottom := height - botM
	yOf := func(v float64) float64 {
		if v <= lo {
			return float64(plotBottom)
		}
		return float64(plotBottom) - float64(plotBottom-topM)*math.Log10(v/lo)/math.Log10(hi/lo)
	}
	for i, name := range []string{"p50", "p99", "p99.9"} {
		x0 := leftM + i*(panelW+panelGap)
		for d := lo; d <= hi*1.0001; d *= 10 {
			y := int(yOf(d))
			c.rect(x0, y, x0+panelW, y+1, colGrid)
			if i == 0 {
				c.text(x0-6, y+4, durLabel(d), colAxis, right, true)
			}
		}
		c.rect(x0, topM, x0+1, plotBottom, colAxis)
		c.rect(x0, plotBottom, x0+panelW, plotBottom+1, colAxis)
		c.text(x0+panelW/2, topM-8, name, colBlack, center, false)
		xOf := func(j int) float64 {
			return float64(x0) + float64(panelW)*(float64(j)+0.5)/float64(len(rates))
		}
		for j, r := range rates {
			c.text(int(xOf(j)), plotBottom+16, si(r)+"/s", colAxis, center, true)
		}
		c.text(x0+panelW/2, plotBottom+40, "events/s, all watches", colAxis, center, true)
		for _, p := range paths {
			var px, py []float64
			for j, r := range rates {
				for _, l := range res.Latency {
					if l.Path == p && l.Rate == r {
						v := []time.Duration{l.P50, l.P99, l.P999}[i]
						if v > 0 {
							px, py = append(px, xOf(j)), append(py, yOf(us(v)))
						}
					}
				}
			}
			for k := range px {
				if k > 0 {
					c.line(px[k-1], py[k-1], px[k], py[k], 2, pathColor[p])
				}
				c.rect(int(px[k])-3, int(py[k])-3, int(px[k])+4, int(py[k])+4, pathColor[p])
			}
		}
	}
	return c.save(path)
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// durLabel labels a microsecond axis value.
func durLabel(v float64) string {
	switch {
	case v >= 1e6:
		return trimZero(fmt.Sprintf("%.0f", v/1e6)) + " s"
	case v >= 1e3:
		return trimZero(fmt.Sprintf("%.0f", v/1e3)) + " ms"
	}
	return trimZero(fmt.Sprintf("%.0f", v)) + " µs"
}

// memoryChart: resident memory per idle watch, one group of bars per number of watches.
func memoryChart(path string, res *Results) error {
	if len(res.Memory) == 0 {
		return nil
	}
	var counts []int
	seen := map[int]bool{}
	maxV := 0.0
	for _, m := range res.Memory {
		if !seen[m.Watches] {
			seen[m.Watches] = true
			counts = append(counts, m.Watches)
		}
		maxV = math.Max(maxV, m.PerWatchKiB)
	}
	paths := presentPaths(func(p PathName) bool {
		for _, m := range res.Memory {
			if m.Path == p {
				return true
			}
		}
		return false
	})
	const width, height, topM, botM, leftM, rightM = 800, 420, 80, 50, 70, 20
	c, err := newCanvas(width, height)
	if err != nil {
		return err
	}
	c.text(width/2, 22, "Resident memory per idle watch, KiB (VmRSS growth / watches; median)", colBlack, center, false)
	c.legend(leftM, 50, paths)
	step := niceStep(maxV / 5)
	top := math.Max(step, math.Ceil(maxV/step)*step)
	plotBottom := height - botM
	yOf := func(v float64) int { return plotBottom - int(float64(plotBottom-topM)*v/top) }
	for v := 0.0; v <= top*1.0001; v += step {
		y := yOf(v)
		c.rect(leftM, y, width-rightM, y+1, colGrid)
		c.text(leftM-6, y+4, trimZero(fmt.Sprintf("%.0f", v)), colAxis, right, true)
	}
	groupW := (width - leftM - rightM) / len(counts)
	barW := min(60, (groupW-40)/max(1, len(paths)))
	for i, n := range counts {
		gx := leftM + i*groupW + (groupW-barW*len(paths))/2
		for j, p := range paths {
			for _, m := range res.Memory {
				if m.Path == p && m.Watches == n && m.PerWatchKiB > 0 {
					x := gx + j*barW
					c.rect(x+2, yOf(m.PerWatchKiB), x+barW-2, plotBottom, pathColor[p])
					c.text(x+barW/2, yOf(m.PerWatchKiB)-4, fmt.Sprintf("%.1f", m.PerWatchKiB), colBlack, center, true)
				}
			}
		}
		c.text(leftM+i*groupW+groupW/2, plotBottom+18, fmt.Sprintf("%d idle watches", n), colBlack, center, false)
	}
	c.rect(leftM, plotBottom, width-rightM, plotBottom+1, colAxis)
	return c.save(path)
}

// niceStep rounds v up to 1, 2 or 5 times a power of ten.
func niceStep(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// fanOutColor colours the fan-out modes: direct as the direct path, the watchsan modes as
// watchsan's paths.
var fanOutColor = map[FanOutMode]color.RGBA{
	FanDirect:   pathColor[Direct],
	FanOwn:      pathColor[WatchsanObserve],
	FanReviewed: pathColor[WatchsanRepair],
	FanLent:     pathColor[WatchsanShare],
}

// fanOutChart: the fan-out runs, two panels of bars grouped by number of clients, log scale:
// the upstream watches the apiserver held, and its CPU for the fan-out.
func fanOutChart(path string, res *Results) error {
	if len(res.FanOut) == 0 {
		return nil
	}
	names := make([]string, len(FanOutModes))
	cols := make([]color.RGBA, len(FanOutModes))
	for i, m := range FanOutModes {
		names[i], cols[i] = string(m), fanOutColor[m]
	}
	const width, height, topM, botM, leftM, panelGap = 1050, 430, 80, 50, 60, 50
	c, err := newCanvas(width, height)
	if err != nil {
		return err
	}
	c.text(width/2, 22, fmt.Sprintf("N identical watches, then %d writes, on a real kube-apiserver (log scale)", res.FanOut[0].Writes), colBlack, center, false)
	c.legendOf(leftM, 50, names, cols)
	panelW := (width - leftM - panelGap - 20) / 2
	panels := []struct {
		title string
		value func(*FanOutResult, *FanOutSample) float64
	}{
		{"upstream watches the apiserver holds", func(_ *FanOutResult, s *FanOutSample) float64 { return s.UpstreamWatches }},
		{"apiserver CPU for the fan-out, 10 ms ticks", func(r *FanOutResult, s *FanOutSample) float64 { return float64(r.FanOutTicks(s)) }},
	}
	plotBottom := height - botM
	for pi, panel := range panels {
		x0 := leftM + pi*(panelW+panelGap)
		var all []float64
		for _, r := range res.FanOut {
			for i := range r.Samples {
				all = append(all, math.Max(1, panel.value(r, &r.Samples[i])))
			}
		}
		lo, hi := logRange(all)
		lo = math.Min(lo, 1)
		yOf := func(v float64) int {
			if v <= lo {
				return plotBottom
			}
			return plotBottom - int(float64(plotBottom-topM)*math.Log10(v/lo)/math.Log10(hi/lo))
		}
		for d := lo; d <= hi*1.0001; d *= 10 {
			y := yOf(d)
			c.rect(x0, y, x0+panelW, y+1, colGrid)
			c.text(x0-6, y+4, si(d), colAxis, right, true)
		}
		c.text(x0+panelW/2, topM-12, panel.title, colBlack, center, false)
		groupW := panelW / len(res.FanOut)
		barW := min(40, (groupW-20)/len(FanOutModes))
		for gi, r := range res.FanOut {
			gx := x0 + gi*groupW + (groupW-barW*len(FanOutModes))/2
			for j, m := range FanOutModes {
				s := r.Of(m)
				if s == nil {
					continue
				}
				v := panel.value(r, s)
				x := gx + j*barW
				if v > lo {
					c.rect(x+2, yOf(v), x+barW-2, plotBottom, fanOutColor[m])
				}
				c.text(x+barW/2, yOf(math.Max(v, lo))-4, trimZero(fmt.Sprintf("%.0f", v)), colBlack, center, true)
			}
			c.text(x0+gi*groupW+groupW/2, plotBottom+18, fmt.Sprintf("%d clients", r.Clients), colBlack, center, false)
		}
		c.rect(x0, plotBottom, x0+panelW, plotBottom+1, colAxis)
	}
	return c.save(path)
}

// scaleColor colours the scale modes: the direct ones as the direct path, the watchsan ones
// as watchsan's.
var scaleColor = map[ScaleMode]color.RGBA{
	ScaleDirect1:   fanOutColor[FanDirect],
	ScaleDirect2:   {0x8c, 0x8c, 0x8c, 0xff},
	ScaleWatchsan1: fanOutColor[FanLent],
	ScaleWatchsan2: fanOutColor[FanReviewed],
}

// scaleChart draws the delivery latency (p50 and p99) against the number of watchers, one line
// per mode, both axes log scale.
func scaleChart(path string, res *Results) error {
	if len(res.Scale) == 0 {
		return nil
	}
	names := make([]string, len(ScaleModes))
	cols := make([]color.RGBA, len(ScaleModes))
	for i, m := range ScaleModes {
		names[i], cols[i] = string(m), scaleColor[m]
	}
	const width, height, topM, botM, leftM, panelGap = 1050, 430, 80, 50, 70, 60
	c, err := newCanvas(width, height)
	if err != nil {
		return err
	}
	c.text(width/2, 22, fmt.Sprintf("delivery latency of %d writes against watchers over %d feeds, on a real kube-apiserver (log scales)",
		res.Scale[0].Writes, res.Scale[0].Feeds), colBlack, center, false)
	c.legendOf(leftM, 50, names, cols)
	panelW := (width - leftM - panelGap - 20) / 2
	var xs, all []float64
	for _, sr := range res.Scale {
		xs = append(xs, float64(sr.Watchers))
		for i := range sr.Samples {
			if s := &sr.Samples[i]; s.Delivered > 0 {
				all = append(all, us(s.P50), us(s.P99))
			}
		}
	}
	if len(all) == 0 {
		return nil
	}
	xlo, xhi := logRange(xs)
	if xhi <= xlo {
		xhi = xlo * 10
	}
	lo, hi := logRange(all)
	if hi <= lo {
		hi = lo * 10
	}
	plotBottom := height - botM
	panels := []struct {
		title string
		value func(*ScaleSample) time.Duration
	}{
		{"p50", func(s *ScaleSample) time.Duration { return s.P50 }},
		{"p99", func(s *ScaleSample) time.Duration { return s.P99 }},
	}
	for pi, panel := range panels {
		x0 := leftM + pi*(panelW+panelGap)
		xOf := func(v float64) float64 {
			return float64(x0) + float64(panelW)*math.Log10(v/xlo)/math.Log10(xhi/xlo)
		}
		yOf := func(v float64) float64 {
			v = math.Max(v, lo)
			return float64(plotBottom) - float64(plotBottom-topM)*math.Log10(v/lo)/math.Log10(hi/lo)
		}
		for d := lo; d <= hi*1.0001; d *= 10 {
			y := int(yOf(d))
			c.rect(x0, y, x0+panelW, y+1, colGrid)
			c.text(x0-6, y+4, durLabel(d), colAxis, right, true)
		}
		for _, x := range xs {
			c.text(int(xOf(x)), plotBottom+18, fmt.Sprintf("%d", int(x)), colBlack, center, true)
		}
		c.text(x0+panelW/2, topM-12, panel.title+" from a write to its delivery", colBlack, center, false)
		for _, m := range ScaleModes {
			var px, py float64
			first := true
			for _, sr := range res.Scale {
				s := sr.Of(m)
				if s == nil || s.Delivered == 0 {
					continue
				}
				x, y := xOf(float64(sr.Watchers)), yOf(us(panel.value(s)))
				if !first {
					c.line(px, py, x, y, 2, scaleColor[m])
				}
				c.rect(int(x)-3, int(y)-3, int(x)+3, int(y)+3, scaleColor[m])
				px, py, first = x, y, false
			}
		}
		c.rect(x0, plotBottom, x0+panelW, plotBottom+1, colAxis)
	}
	return c.save(path)
}
