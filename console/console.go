// Package console is the pool console's page: its HTML, script and style,
// embedded in the allocator and served at /console/ beside the API that
// feeds it, GET /v1/console. The page holds no data. It asks for a token
// and reads the API with it, so what a token sees on the page is what it
// sees through the API: the admin token everything, a namespace's token
// its own leases, pending requests and quota.
package console

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed assets
var assets embed.FS

// Path is where the page is served.
const Path = "/console/"

// Handler serves the page's files under Path. The page loads nothing from
// elsewhere, and its policy says so: no inline script, no frame around it.
func Handler() http.Handler {
	files, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	serve := http.StripPrefix(Path, http.FileServerFS(files))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; form-action 'none'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		serve.ServeHTTP(w, r)
	})
}
