package harness

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/valkey-io/valkey-go"
)

// Info returns the fields of an INFO section of the node c talks to, e.g.
// Info(ctx, c, "memory")["used_memory"].
func Info(ctx context.Context, c valkey.Client, section string) (map[string]string, error) {
	txt, err := verbatim(c.Do(ctx, c.B().Info().Section(section).Build()))
	if err != nil {
		return nil, fmt.Errorf("INFO %s: %w", section, err)
	}
	return ParseInfo(txt), nil
}

// ParseInfo splits INFO text into its key: value fields, section headers left out.
func ParseInfo(txt string) map[string]string {
	m := map[string]string{}
	for line := range strings.Lines(txt) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && !strings.HasPrefix(k, "#") {
			m[k] = v
		}
	}
	return m
}

// CommandStat is one command's counters from INFO commandstats.
type CommandStat struct {
	Calls    int64 // calls that ran
	Usec     int64 // server time they took
	Failed   int64 // calls that ran and returned an error
	Rejected int64 // calls refused before running
}

// CommandStats returns the counters of cmd (e.g. "fcall_ro") on the node c talks to; a
// command never called has zero counters.
func CommandStats(ctx context.Context, c valkey.Client, cmd string) (CommandStat, error) {
	info, err := Info(ctx, c, "commandstats")
	if err != nil {
		return CommandStat{}, err
	}
	v, ok := info["cmdstat_"+cmd]
	if !ok {
		return CommandStat{}, nil
	}
	return ParseCommandStat(v)
}

// ParseCommandStat parses an INFO commandstats entry such as
// "calls=20000,usec=301234,usec_per_call=15.06,rejected_calls=0,failed_calls=0".
func ParseCommandStat(v string) (CommandStat, error) {
	f := map[string]int64{}
	for kv := range strings.SplitSeq(v, ",") {
		if k, val, ok := strings.Cut(kv, "="); ok {
			if n, err := strconv.ParseInt(val, 10, 64); err == nil {
				f[k] = n
			}
		}
	}
	if _, ok := f["calls"]; !ok {
		return CommandStat{}, fmt.Errorf("no calls= in %q", v)
	}
	return CommandStat{Calls: f["calls"], Usec: f["usec"], Failed: f["failed_calls"], Rejected: f["rejected_calls"]}, nil
}

// LibraryCode returns the code of the function library name on the node c talks to, "" when
// it has none.
func LibraryCode(ctx context.Context, c valkey.Client, name string) (string, error) {
	libs, err := c.Do(ctx, c.B().FunctionList().Libraryname(name).Withcode().Build()).ToArray()
	if err != nil {
		return "", err
	}
	// LIBRARYNAME is a pattern (and case-insensitive on Redis 7.0): pick the exact name.
	for _, l := range libs {
		m, err := l.AsMap()
		if err != nil {
			return "", err
		}
		n, lc := m["library_name"], m["library_code"]
		if got, _ := n.ToString(); got == name {
			return lc.ToString()
		}
	}
	return "", nil
}

// WaitReplicas waits until s, a primary, has n replicas connected and online.
func (s *Server) WaitReplicas(ctx context.Context, n int) error {
	c, err := s.newClient()
	if err != nil {
		return err
	}
	defer c.Close()
	return waitFor(ctx, fmt.Sprintf("%d replicas of %s online", n, s.Addr), func() error {
		info, err := Info(ctx, c, "replication")
		if err != nil {
			return err
		}
		if info["connected_slaves"] != strconv.Itoa(n) {
			return fmt.Errorf("connected_slaves=%s", info["connected_slaves"])
		}
		for i := range n {
			if r := info[fmt.Sprintf("slave%d", i)]; !strings.Contains(r, "state=online") {
				return fmt.Errorf("slave%d: %s", i, r)
			}
		}
		return nil
	})
}
