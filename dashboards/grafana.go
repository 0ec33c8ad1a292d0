package dashboards

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// The Grafana dashboard JSON, as much of it as the dashboards set; Grafana
// fills in the rest with its defaults.

type dashboardJSON struct {
	UID           string            `json:"uid"`
	Title         string            `json:"title"`
	Description   string            `json:"description"`
	Tags          []string          `json:"tags"`
	Editable      bool              `json:"editable"`
	GraphTooltip  int               `json:"graphTooltip"`
	Links         []linkJSON        `json:"links"`
	Panels        []panelJSON       `json:"panels"`
	Refresh       string            `json:"refresh"`
	SchemaVersion int               `json:"schemaVersion"`
	Templating    templatingJSON    `json:"templating"`
	Time          map[string]string `json:"time"`
	Timezone      string            `json:"timezone"`
	Version       int               `json:"version"`
}

type linkJSON struct {
	Title       string   `json:"title"`
	Type        string   `json:"type"`
	Tags        []string `json:"tags"`
	AsDropdown  bool     `json:"asDropdown"`
	IncludeVars bool     `json:"includeVars"`
	KeepTime    bool     `json:"keepTime"`
}

type templatingJSON struct {
	List []variableJSON `json:"list"`
}

type variableJSON struct {
	Name       string         `json:"name"`
	Label      string         `json:"label"`
	Type       string         `json:"type"`
	Datasource *datasourceRef `json:"datasource,omitempty"`
	Query      string         `json:"query"`
	Definition string         `json:"definition,omitempty"`
	Refresh    int            `json:"refresh"`
	IncludeAll bool           `json:"includeAll"`
	AllValue   string         `json:"allValue,omitempty"`
	Multi      bool           `json:"multi"`
	Sort       int            `json:"sort"`
	Current    map[string]any `json:"current"`
	Options    []any          `json:"options"`
	Hide       int            `json:"hide"`
	Regex      string         `json:"regex"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// prometheus is the $datasource variable every panel and target uses.
var prometheus = &datasourceRef{Type: "prometheus", UID: "${datasource}"}

type gridPos struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

type panelJSON struct {
	ID              int              `json:"id"`
	Type            string           `json:"type"`
	Title           string           `json:"title"`
	Description     string           `json:"description,omitempty"`
	GridPos         gridPos          `json:"gridPos"`
	Datasource      *datasourceRef   `json:"datasource,omitempty"`
	FieldConfig     *fieldConfigJSON `json:"fieldConfig,omitempty"`
	Options         map[string]any   `json:"options,omitempty"`
	Targets         []targetJSON     `json:"targets,omitempty"`
	Transformations []map[string]any `json:"transformations,omitempty"`
	Collapsed       *bool            `json:"collapsed,omitempty"` // rows only
}

type fieldConfigJSON struct {
	Defaults  fieldDefaultsJSON `json:"defaults"`
	Overrides []any             `json:"overrides"`
}

type fieldDefaultsJSON struct {
	Unit       string         `json:"unit,omitempty"`
	Min        *float64       `json:"min,omitempty"`
	Max        *float64       `json:"max,omitempty"`
	Color      map[string]any `json:"color"`
	Thresholds thresholdsJSON `json:"thresholds"`
	Custom     map[string]any `json:"custom,omitempty"`
}

type thresholdsJSON struct {
	Mode  string     `json:"mode"`
	Steps []stepJSON `json:"steps"`
}

type stepJSON struct {
	Color string   `json:"color"`
	Value *float64 `json:"value"` // null: the base step
}

type targetJSON struct {
	Datasource   *datasourceRef `json:"datasource"`
	RefID        string         `json:"refId"`
	Expr         string         `json:"expr"`
	LegendFormat string         `json:"legendFormat,omitempty"`
	Format       string         `json:"format"`
	Instant      bool           `json:"instant"`
	Range        bool           `json:"range"`
	EditorMode   string         `json:"editorMode"`
}

// gridWidth is the width of Grafana's grid.
const gridWidth = 24

// JSON renders the dashboard as Grafana JSON, its queries expanded by c.
func (c Config) JSON(d Dashboard) ([]byte, error) {
	out := dashboardJSON{
		UID: d.UID(), Title: "gpupool / " + d.Title, Description: d.Description,
		Tags: []string{"gpupool"}, Editable: true, GraphTooltip: 1, // shared crosshair
		Links: []linkJSON{{Title: "gpupool", Type: "dashboards", Tags: []string{"gpupool"},
			AsDropdown: true, IncludeVars: true, KeepTime: true}},
		Refresh: "30s", SchemaVersion: 39, Time: map[string]string{"from": "now-1h", "to": "now"},
		Timezone: "browser", Version: 1,
	}
	out.Templating.List = c.variables(d)
	out.Panels = c.layout(d.Rows)
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // keep PromQL's < > & readable in the file
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return nil, fmt.Errorf("dashboard %s: %w", d.Name, err)
	}
	return b.Bytes(), nil
}

// variables returns the datasource variable, then the dashboard's.
func (c Config) variables(d Dashboard) []variableJSON {
	all := map[string]any{"selected": true, "text": []string{"All"}, "value": []string{"$__all"}}
	out := []variableJSON{{
		Name: "datasource", Label: "Data source", Type: "datasource", Query: "prometheus", Refresh: 1,
		Current: map[string]any{}, Options: []any{},
	}}
	for _, v := range c.variablesOf(d) {
		q := fmt.Sprintf("label_values(%s, %s)", c.expand(v.Series), v.Label)
		out = append(out, variableJSON{
			Name: v.Label, Label: v.Label, Type: "query", Datasource: prometheus, Query: q, Definition: q,
			Refresh:    2, // on time range change: the values follow what is scraped
			IncludeAll: true, AllValue: ".*", Multi: true, Sort: 1, Current: all, Options: []any{},
		})
	}
	return out
}

// layout places the rows and their panels on the grid and numbers them.
func (c Config) layout(rows []Row) []panelJSON {
	var out []panelJSON
	y := 0
	for _, r := range rows {
		out = append(out, panelJSON{ID: len(out) + 1, Type: "row", Title: r.Title,
			GridPos: gridPos{H: 1, W: gridWidth, Y: y}, Collapsed: new(false)})
		y++
		x, lineHeight := 0, 0
		for _, p := range r.Panels {
			w, h := p.size()
			if x+w > gridWidth {
				x, y, lineHeight = 0, y+lineHeight, 0
			}
			out = append(out, c.panel(p, len(out)+1, gridPos{H: h, W: w, X: x, Y: y}))
			x += w
			lineHeight = max(lineHeight, h)
		}
		y += lineHeight
	}
	return out
}

// size is the panel's width and height, the kind's default where unset.
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

func (c Config) panel(p Panel, id int, pos gridPos) panelJSON {
	out := panelJSON{ID: id, Type: string(p.Kind), Title: p.Title, Description: p.Description,
		GridPos: pos, Datasource: prometheus, Options: p.options()}
	defaults := fieldDefaultsJSON{Color: map[string]any{"mode": "thresholds"},
		Thresholds: thresholdsJSON{Mode: "absolute", Steps: []stepJSON{{Color: "green"}}}}
	for _, s := range p.Steps {
		defaults.Thresholds.Steps = append(defaults.Thresholds.Steps, stepJSON{Color: s.Color, Value: new(s.Value)})
	}
	if p.Kind != Heatmap { // its unit is the y axis's, the buckets' bounds
		defaults.Unit = p.Unit
	}
	if p.Kind != Heatmap && p.Kind != Table {
		defaults.Min = new(0.0) // every value gpupool exports is non-negative
	}
	if p.Max > 0 {
		defaults.Max = new(p.Max)
	}
	if p.Kind == Timeseries {
		defaults.Color = map[string]any{"mode": "palette-classic"}
		defaults.Custom = map[string]any{"fillOpacity": 10, "lineWidth": 1, "showPoints": "never", "spanNulls": false}
	}
	out.FieldConfig = &fieldConfigJSON{Defaults: defaults, Overrides: []any{}}
	for i, t := range p.Targets {
		tj := targetJSON{Datasource: prometheus, RefID: string(rune('A' + i)), Expr: c.expand(t.Expr),
			LegendFormat: t.Legend, Format: "time_series", Range: true, EditorMode: "code"}
		switch p.Kind {
		case Heatmap:
			tj.Format = "heatmap"
		case Table:
			tj.Format, tj.Instant, tj.Range, tj.LegendFormat = "table", true, false, ""
			out.Transformations = []map[string]any{{"id": "organize", "options": map[string]any{
				"excludeByName": map[string]bool{"Time": true},
				"renameByName":  map[string]string{"Value": t.Legend},
			}}}
		}
		out.Targets = append(out.Targets, tj)
	}
	return out
}

// options are the panel's options, by kind.
func (p Panel) options() map[string]any {
	reduce := map[string]any{"calcs": []string{"lastNotNull"}, "fields": "", "values": false}
	switch p.Kind {
	case Timeseries:
		return map[string]any{
			"legend":  map[string]any{"displayMode": "list", "placement": "bottom", "showLegend": true, "calcs": []string{}},
			"tooltip": map[string]any{"mode": "multi", "sort": "desc"},
		}
	case Stat:
		return map[string]any{"reduceOptions": reduce, "colorMode": "value", "graphMode": "area",
			"justifyMode": "auto", "orientation": "auto", "textMode": "auto"}
	case BarGauge:
		return map[string]any{"reduceOptions": reduce, "displayMode": "gradient", "orientation": "horizontal",
			"showUnfilled": true}
	case Heatmap:
		return map[string]any{
			"calculate":    false, // the buckets are the histogram's
			"cellGap":      1,
			"color":        map[string]any{"mode": "scheme", "scheme": "Oranges", "scale": "exponential", "exponent": 0.5, "steps": 64},
			"filterValues": map[string]any{"le": 1e-9}, // hide empty buckets
			"legend":       map[string]any{"show": true},
			"tooltip":      map[string]any{"show": true, "yHistogram": true},
			"yAxis":        map[string]any{"axisPlacement": "left", "unit": p.Unit},
		}
	case Table:
		return map[string]any{"showHeader": true, "cellHeight": "sm"}
	}
	return nil
}
