package dashboards

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/bargauge"
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/heatmap"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// The dashboards are rendered with grafana-foundation-sdk's builders for
// Grafana's dashboard JSON (the "v1" model Grafana's provisioning and
// dashboard sidecar load, which the SDK marks deprecated in favour of its
// v2 resource model that only Grafana 12's new API takes).

// datasource is the $datasource variable every panel and target uses.
var datasource = common.DataSourceRef{Type: new("prometheus"), Uid: new("${datasource}")}

// JSON renders the dashboard as Grafana JSON, its queries expanded by c.
func (c Config) JSON(d Dashboard) ([]byte, error) {
	//nolint:staticcheck // the v1 model, see above
	b := dashboard.NewDashboardBuilder("gpupool / "+d.Title).
		Uid(d.UID()).Description(d.Description).Tags([]string{"gpupool"}).Editable().
		Tooltip(dashboard.DashboardCursorSyncCrosshair). // shared crosshair
		Link(dashboard.NewDashboardLinkBuilder("gpupool").Type(dashboard.DashboardLinkTypeDashboards).Tags([]string{"gpupool"}).
			AsDropdown(true).IncludeVars(true).KeepTime(true)).
		Refresh("30s").Time("now-1h", "now").Timezone(common.TimeZoneBrowser).Version(1)
	for _, v := range c.variables(d) {
		b.WithVariable(v)
	}
	// Numbered in order, rows included, so that panel links stay stable.
	id := uint32(0)
	for _, r := range d.Rows {
		id++
		b.WithRow(dashboard.NewRowBuilder(r.Title).Id(id))
		for _, p := range r.Panels {
			id++
			panel, err := c.panel(p, id)
			if err != nil {
				return nil, fmt.Errorf("dashboard %s: %w", d.Name, err)
			}
			b.WithPanel(panel)
		}
	}
	out, err := b.Build()
	if err != nil {
		return nil, fmt.Errorf("dashboard %s: %w", d.Name, err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // keep PromQL's < > & readable in the file
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return nil, fmt.Errorf("dashboard %s: %w", d.Name, err)
	}
	return buf.Bytes(), nil
}

// variables returns the datasource variable, then the dashboard's.
func (c Config) variables(d Dashboard) []cog.Builder[dashboard.VariableModel] {
	out := []cog.Builder[dashboard.VariableModel]{
		dashboard.NewDatasourceVariableBuilder("datasource").Label("Data source").Type("prometheus"),
	}
	all := dashboard.VariableOption{Selected: new(true), Text: dashboard.StringOrArrayOfString{ArrayOfString: []string{"All"}},
		Value: dashboard.StringOrArrayOfString{ArrayOfString: []string{"$__all"}}}
	for _, v := range c.variablesOf(d) {
		q := fmt.Sprintf("label_values(%s, %s)", c.expand(v.Series), v.Label)
		out = append(out, dashboard.NewQueryVariableBuilder(v.Label).Label(v.Label).Datasource(datasource).
			Query(dashboard.StringOrMap{String: &q}).Definition(q).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged). // the values follow what is scraped
			IncludeAll(true).AllValue(".*").Multi(true).Sort(dashboard.VariableSortAlphabeticalAsc).Current(all))
	}
	return out
}

// panelBuilder is what the SDK's builders of every panel type share.
type panelBuilder[B any] interface {
	cog.Builder[dashboard.Panel]
	Id(id uint32) B
	Title(title string) B
	Description(description string) B
	Datasource(datasource common.DataSourceRef) B
	Span(w uint32) B
	Height(h uint32) B
	Unit(unit string) B
	Min(min float64) B
	Max(max float64) B
	Thresholds(thresholds cog.Builder[dashboard.ThresholdsConfig]) B
	ColorScheme(color cog.Builder[dashboard.FieldColor]) B
	WithTarget(target cog.Builder[variants.Dataquery]) B
}

// panel builds p with the options of its kind; the SDK places it on the
// grid after the one before, wrapping at the grid's width.
func (c Config) panel(p Panel, id uint32) (cog.Builder[dashboard.Panel], error) {
	reduce := common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}).Fields("").Values(false)
	switch p.Kind {
	case Timeseries:
		b := timeseries.NewPanelBuilder().FillOpacity(10).LineWidth(1).ShowPoints(common.VisibilityModeNever).
			SpanNulls(common.BoolOrFloat64{Bool: new(false)}).
			Legend(common.NewVizLegendOptionsBuilder().DisplayMode(common.LegendDisplayModeList).
				Placement(common.LegendPlacementBottom).ShowLegend(true).Calcs([]string{})).
			Tooltip(common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending))
		return withPanel(c, b, p, id).ColorScheme(dashboard.NewFieldColorBuilder().Mode(dashboard.FieldColorModeIdPaletteClassic)), nil
	case Stat:
		return withPanel(c, stat.NewPanelBuilder().ReduceOptions(reduce).ColorMode(common.BigValueColorModeValue).
			GraphMode(common.BigValueGraphModeArea).JustifyMode(common.BigValueJustifyModeAuto).
			Orientation(common.VizOrientationAuto).TextMode(common.BigValueTextModeAuto), p, id), nil
	case BarGauge:
		return withPanel(c, bargauge.NewPanelBuilder().ReduceOptions(reduce).DisplayMode(common.BarGaugeDisplayModeGradient).
			Orientation(common.VizOrientationHorizontal).ShowUnfilled(true), p, id), nil
	case Heatmap:
		return withPanel(c, heatmap.NewPanelBuilder().
			Calculate(false). // the buckets are the histogram's
			CellGap(1).
			Color(heatmap.NewHeatmapColorOptionsBuilder().Mode(heatmap.HeatmapColorModeScheme).Scheme("Oranges").
											Scale(heatmap.HeatmapColorScaleExponential).Exponent(0.5).Steps(64)).
			FilterValues(heatmap.NewFilterValueRangeBuilder().Le(1e-9)). // hide empty buckets
			ShowLegend().
			Tooltip(heatmap.NewHeatmapTooltipBuilder().Mode(common.TooltipDisplayModeSingle).YHistogram(true)).
			YAxis(heatmap.NewYAxisConfigBuilder().AxisPlacement(common.AxisPlacementLeft).Unit(p.Unit)), p, id), nil
	case Table:
		return withPanel(c, table.NewPanelBuilder().ShowHeader(true).CellHeight(common.TableCellHeightSm).
			WithTransformation(dashboard.DataTransformerConfig{Id: "organize", Options: map[string]any{
				"excludeByName": map[string]bool{"Time": true},
				"renameByName":  map[string]string{"Value": p.Targets[0].Legend},
			}}), p, id), nil
	}
	return nil, fmt.Errorf("panel %q: no panel type %q", p.Title, p.Kind)
}

// withPanel sets what every panel has: title, size, field defaults and
// the queries.
func withPanel[B panelBuilder[B]](c Config, b B, p Panel, id uint32) B {
	w, h := p.size()
	b.Id(id).Title(p.Title).Description(p.Description).Datasource(datasource).Span(uint32(w)).Height(uint32(h))
	steps := []dashboard.Threshold{{Color: "green"}} // the base step, from -Inf
	for _, s := range p.Steps {
		steps = append(steps, dashboard.Threshold{Color: s.Color, Value: new(s.Value)})
	}
	b.Thresholds(dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps(steps)).
		ColorScheme(dashboard.NewFieldColorBuilder().Mode(dashboard.FieldColorModeIdThresholds))
	if p.Kind != Heatmap { // its unit is the y axis's, the buckets' bounds
		b.Unit(p.Unit)
	}
	if p.Kind != Heatmap && p.Kind != Table {
		b.Min(0) // every value gpupool exports is non-negative
	}
	if p.Max > 0 {
		b.Max(p.Max)
	}
	for i, t := range p.Targets {
		q := prometheus.NewDataqueryBuilder().Datasource(datasource).RefId(string(rune('A' + i))).Expr(c.expand(t.Expr)).
			EditorMode(prometheus.QueryEditorModeCode)
		switch p.Kind {
		case Heatmap:
			q.Format(prometheus.PromQueryFormatHeatmap).Range().LegendFormat(t.Legend)
		case Table: // one instant query, its legend heading the value column
			q.Format(prometheus.PromQueryFormatTable).Instant()
		default:
			q.Format(prometheus.PromQueryFormatTimeSeries).Range().LegendFormat(t.Legend)
		}
		b.WithTarget(q)
	}
	return b
}

// size is the panel's width (of the grid's 24) and height, the kind's
// default where unset.
func (p Panel) size() (w, h int) {
	w, h = 12, 8
	if p.Kind == Stat {
		w, h = 4, 4
	}
	if p.Width > 0 {
		w = p.Width
	}
	if p.Height > 0 {
		h = p.Height
	}
	return w, h
}
