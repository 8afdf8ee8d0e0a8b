package main

import (
	"fmt"
	"net/http"
	"runtime/pprof"
	"strconv"
	"time"
)

// serveProfiles adds Go's profiles to the health endpoint (--profiles), in the format
// go tool pprof reads: /debug/pprof/heap, allocs and goroutine (a snapshot), and
// /debug/pprof/profile?seconds=N (CPU, default 30 s, at most 5 minutes). They are
// written with runtime/pprof directly: net/http/pprof's index page executes an
// html/template, which would link text/template's evaluator and with it every
// exported method of every type (see TestVersionFlagIsStamped).
func serveProfiles(mux *http.ServeMux) {
	for _, name := range []string{"heap", "allocs", "goroutine"} {
		mux.HandleFunc("/debug/pprof/"+name, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", name))
			if err := pprof.Lookup(name).WriteTo(w, 0); err != nil {
				http.Error(w, "writing the "+name+" profile: "+err.Error(), http.StatusInternalServerError)
			}
		})
	}
	mux.HandleFunc("/debug/pprof/profile", func(w http.ResponseWriter, r *http.Request) {
		seconds := 30
		if v := r.URL.Query().Get("seconds"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 300 {
				http.Error(w, "seconds: a whole number from 1 to 300", http.StatusBadRequest)
				return
			}
			seconds = n
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		if err := pprof.StartCPUProfile(w); err != nil {
			http.Error(w, "a CPU profile is already being taken: "+err.Error()+"; try again when it ends", http.StatusConflict)
			return
		}
		select {
		case <-time.After(time.Duration(seconds) * time.Second):
		case <-r.Context().Done():
		}
		pprof.StopCPUProfile()
	})
}
