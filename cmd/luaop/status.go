package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/luaop/luaop/admission"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/peering"
	"github.com/luaop/luaop/sharding"
)

// debugDoc is the document /debug serves: the operator's Debug and its version.
type debugDoc struct {
	Version string `json:"version"`
	// Election is "leader" or "standby" with --leader-elect, else empty: a standby
	// handles nothing, so its objects, daemons and timers are empty.
	Election string `json:"election,omitempty"`
	// Peering is peering's state (absent with --standalone); Webhooks where the
	// API server calls the admission handlers and whether the probe proved it.
	Peering  *peering.State `json:"peering,omitempty"`
	Webhooks *webhooksDoc   `json:"webhooks,omitempty"`
	// Sharding is this replica's part in sharding (with --shard-across-replicas).
	Sharding *sharding.State `json:"sharding,omitempty"`
	operator.Debug
}

// webhooksDoc is /debug's part about the webhooks.
type webhooksDoc struct {
	// Address is where the server listens; Found how the address given to the API
	// server was found (detection), when it was.
	Address string `json:"address"`
	Found   string `json:"found,omitempty"`
	// Unregistered says why the configurations are not written at all.
	Unregistered string                 `json:"unregistered,omitempty"`
	Reachability admission.Reachability `json:"reachability"`
}

func webhooksDebug(w *admission.Webhooks) *webhooksDoc {
	return &webhooksDoc{Address: w.Addr().String(), Found: w.Endpoint().How, Unregistered: w.Unreachable(), Reachability: w.Reachability()}
}

// debugHandler serves /debug: what the operator is doing now, as JSON.
func debugHandler(debug func() operator.Debug, election func() string, more func(*debugDoc)) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		doc := debugDoc{Version: luaopVersion(), Election: election(), Debug: debug()}
		if more != nil {
			more(&doc)
		}
		_ = enc.Encode(doc)
	}
}

func newStatusCommand() *cobra.Command {
	var address string
	var raw bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show what a running operator is doing (reads its /debug endpoint)",
		Long: `Read the /debug endpoint of a running luaop (on its --health-address) and print
the scripts' hash, the handlers, the objects in flight with their handlers'
progress, the running daemons and timers, and the last reload's error.

In a cluster (deploy/'s namespace is luaop-system; with --leader-elect only the
leader, the holder of the Lease luaop, handles objects):
  kubectl -n luaop-system port-forward pod/$(kubectl -n luaop-system get lease luaop -o jsonpath='{.spec.holderIdentity}' | cut -d_ -f1) 8080
  luaop status
/debug answers loopback clients only, which port-forward is.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			doc, body, err := fetchDebug(cmd.Context(), address)
			if err != nil {
				return err
			}
			if raw {
				_, err := cmd.OutOrStdout().Write(body)
				return err
			}
			printStatus(cmd.OutOrStdout(), doc, time.Now())
			return nil
		},
	}
	cmd.Flags().StringVar(&address, "address", "localhost:8080", "the operator's --health-address (host:port, or a URL)")
	cmd.Flags().BoolVar(&raw, "json", false, "print /debug's JSON as it is")
	return cmd
}

func fetchDebug(ctx context.Context, address string) (debugDoc, []byte, error) {
	url := address
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	url = strings.TrimSuffix(url, "/")
	if !strings.HasSuffix(url, "/debug") {
		url += "/debug"
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return debugDoc{}, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return debugDoc{}, nil, fmt.Errorf("cannot read %s: %w; is the operator running with --health-address %s? (in a cluster, kubectl port-forward first)", url, err, address)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return debugDoc{}, nil, fmt.Errorf("reading %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return debugDoc{}, nil, fmt.Errorf("%s answered %s: is this a luaop health address?", url, resp.Status)
	}
	var doc debugDoc
	if err := json.Unmarshal(body, &doc); err != nil {
		return debugDoc{}, nil, fmt.Errorf("%s did not answer luaop's /debug JSON: %w", url, err)
	}
	return doc, body, nil
}

// printStatus writes a readable summary of a /debug document.
func printStatus(out io.Writer, d debugDoc, now time.Time) {
	ready := "ready"
	if !d.Ready {
		ready = "not ready (scripts not loaded, or initial listing not processed)"
	}
	fmt.Fprintf(out, "luaop %s: %s\n", d.Version, ready)
	switch d.Election {
	case "leader":
		fmt.Fprintln(out, "leader: this replica handles the objects")
	case "standby":
		fmt.Fprintln(out, "standby: this replica waits for the Lease and handles nothing; ask the leader (its pod holds the Lease)")
	}
	switch {
	case d.ScriptsHash == "":
		fmt.Fprintln(out, "scripts: none serving (they do not load, and there are no last good scripts)")
	case d.ServingLastGood:
		fmt.Fprintf(out, "scripts %s: the last good ones kept by the operator (the mounted ones do not load)\n", d.ScriptsHash)
	default:
		fmt.Fprintf(out, "scripts %s\n", d.ScriptsHash)
	}
	if r := d.LastReload; r != nil {
		result := "ok"
		switch {
		case r.OK:
		case d.ScriptsHash == "":
			result = "FAILED (no scripts serving)"
		case d.ServingLastGood:
			result = "FAILED (the last good scripts keep running)"
		default:
			result = "FAILED (the previous scripts keep running)"
		}
		fmt.Fprintf(out, "last reload %s ago: %s\n", since(now, r.At), strings.TrimSpace(result+" "+strings.Join(r.Files, ", ")))
		if r.Error != "" {
			fmt.Fprintf(out, "  %s\n", r.Error)
		}
	}
	if m := d.LuaMemory; m != nil {
		fmt.Fprintf(out, "Lua memory budget last exceeded %s ago (call %s cancelled, heap %s, budget %s): %s\n",
			since(now, m.At), m.Call, luabind.FormatBytes(m.Heap), luabind.FormatBytes(m.Budget), m.Summary())
	}
	printPeeringAndWebhooks(out, d, now)
	printSharding(out, d.Sharding)
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\nhandlers (%d):\n", len(d.Handlers))
	for _, h := range d.Handlers {
		resource := h.Resource
		if resource == "" {
			resource = "(operator)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", h.Kind, h.ID, resource, h.Source)
	}
	tw.Flush()
	fmt.Fprintf(out, "\nobjects in flight (%d):\n", len(d.Objects))
	for _, o := range d.Objects {
		line := "  " + o.Resource + " " + nsName(o.Namespace, o.Name)
		if o.ProcessingSince != nil {
			line += ", processing for " + since(now, *o.ProcessingSince)
		}
		if o.Reason != "" {
			line += ", cause " + o.Reason
		}
		fmt.Fprintln(out, line)
		for _, h := range o.Handlers {
			line := "      " + h.ID + ": " + h.State
			if h.Delayed != nil {
				line += " until " + h.Delayed.Local().Format("15:04:05")
			}
			if h.Retries > 0 {
				line += fmt.Sprintf(", %d retries", h.Retries)
			}
			if h.Message != "" {
				line += ": " + h.Message
			}
			fmt.Fprintln(out, line)
		}
	}
	tw = tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\ndaemons (%d):\n", len(d.Daemons))
	for _, dm := range d.Daemons {
		state := "running for " + since(now, dm.Since)
		if dm.Stopping {
			state = "stopping"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", dm.Resource, nsName(dm.Namespace, dm.Name), dm.Handler, state)
	}
	fmt.Fprintf(tw, "\ntimers (%d):\n", len(d.Timers))
	for _, t := range d.Timers {
		next := "waits for a change"
		if t.Next != nil {
			next = "next in " + since(*t.Next, now)
		}
		if t.Retries > 0 {
			next += fmt.Sprintf(" (retry %d)", t.Retries)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", t.Resource, nsName(t.Namespace, t.Name), t.Handler, next)
	}
	tw.Flush()
}

func nsName(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}

// since is a short duration from then to now ("0s" when negative).
func since(now, then time.Time) string {
	d := now.Sub(then)
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// printPeeringAndWebhooks prints peering's state and the webhooks' reachability.
func printPeeringAndWebhooks(out io.Writer, d debugDoc, now time.Time) {
	if p := d.Peering; p != nil {
		switch {
		case p.Paused:
			fmt.Fprintf(out, "peering: PAUSED (%s); priority %d, Lease %s/%s\n", p.Reason, p.Priority, p.Namespace, p.Lease)
		case p.Alone:
			fmt.Fprintf(out, "peering: working alone (%s)\n", p.AloneReason)
		default:
			fmt.Fprintf(out, "peering: working; priority %d, Lease %s/%s\n", p.Priority, p.Namespace, p.Lease)
		}
		for _, peer := range p.Peers {
			state := "working"
			if peer.Paused {
				state = "paused"
			}
			fmt.Fprintf(out, "  peer %s: %s\n", peer, state)
		}
	}
	if w := d.Webhooks; w != nil {
		r := w.Reachability
		switch {
		case w.Unregistered != "":
			fmt.Fprintf(out, "webhooks: not registered: %s\n", w.Unregistered)
		case !r.Checked:
			fmt.Fprintf(out, "webhooks: listening on %s; reachability not checked (yet)\n", w.Address)
		case r.Reachable:
			fmt.Fprintf(out, "webhooks: reached by the API server %s ago\n", since(now, r.At))
		default:
			fmt.Fprintf(out, "webhooks: NOT REACHED by the API server (%s ago): %s\n", since(now, r.At), r.Error)
		}
	}
}
