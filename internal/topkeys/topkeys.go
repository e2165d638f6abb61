// Package topkeys is what a Limiter with Options.TopKeys publishes and rlfn top reads: where
// (Key) and in what form (Entry). It lives here rather than in package client because only
// the client's publisher and the CLI share it; a service never reads it.
package topkeys

import "github.com/rlfn/rlfn/internal/keys"

// Key is the start of the keys the Limiters under prefix publish their top denied keys to:
// <prefix>{%top}, then ":" and a process's random id. Like the overrides', it is no
// limiter's key, and all of them share one cluster slot.
func Key(prefix string) string {
	return string(keys.AppendEscaped(nil, prefix)) + "{%top}"
}

// Entry is one key of a process's published top: what rlfn top merges.
type Entry struct {
	Algorithm    string `json:"algorithm"`
	Name         string `json:"name,omitempty"`
	Key          string `json:"key"`
	Denials      int64  `json:"denials"`
	Error        int64  `json:"error,omitempty"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	LastMs       int64  `json:"last_ms"` // Unix ms of the last denial
}
