package llmlimit

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/rlfn/rlfn/client"
)

// header is one response header the middleware sets.
type header struct{ name, value string }

// states is, for each dimension, the state of its tightest limit (the fewest units left) of
// those the middleware knows; nil for none.
type states [dims]*client.Result

// states is what res (the decision, its deciding rule's state) and each (every rule's, as
// the Limiter reports them from the hold's own calls) say of p's dimensions.
func (p *plan) states(res client.Result, each []client.Result) states {
	var st states
	if len(each) == len(p.rules) {
		for i := range each {
			st.consider(p.dims[i], &each[i])
		}
	} else if res.Rule >= 0 && res.Rule < len(p.rules) {
		st.consider(p.dims[res.Rule], &res)
	}
	return st
}

func (st *states) consider(d dim, r *client.Result) {
	if r.Limit == 0 { // a block's, or no state
		return
	}
	if b := st[d]; b == nil || r.Remaining < b.Remaining {
		st[d] = r
	}
}

// headerDims are the dimensions the API's headers report.
func headerDims(api API) []dim {
	if api.anthropic() {
		return []dim{dimRequests, dimTokens, dimInput, dimOutput}
	}
	return []dim{dimRequests, dimTokens}
}

// quotaHeaders are the headers that report the limits' state, in the API's own names:
//
//	OpenAI:    x-ratelimit-{limit,remaining,reset}-{requests,tokens}
//	Anthropic: anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}
//
// each describing its dimension's tightest limit in st. OpenAI's reset is a duration ("1s",
// "6m0s"), Anthropic's an RFC 3339 time.
func (m *Middleware) quotaHeaders(api API, best states) []header {
	var out []header
	if api.anthropic() {
		now := m.opts.Now()
		for _, d := range headerDims(api) {
			r := best[d]
			if r == nil {
				continue
			}
			name := "Anthropic-Ratelimit-" + anthropicNames[d] + "-"
			out = append(out,
				header{name + "Limit", strconv.FormatInt(r.Limit, 10)},
				header{name + "Remaining", strconv.FormatInt(r.Remaining, 10)},
				header{name + "Reset", now.Add(ceilSecond(r.ResetAfter)).UTC().Truncate(time.Second).Format(time.RFC3339)})
		}
		return out
	}
	for _, d := range headerDims(api) {
		r := best[d]
		if r == nil {
			continue
		}
		out = append(out,
			header{"X-Ratelimit-Limit-" + names[d], strconv.FormatInt(r.Limit, 10)},
			header{"X-Ratelimit-Remaining-" + names[d], strconv.FormatInt(r.Remaining, 10)},
			header{"X-Ratelimit-Reset-" + names[d], ceilMilli(r.ResetAfter).String()})
	}
	return out
}

var anthropicNames = [dims]string{"Requests", "Tokens", "Input-Tokens", "Output-Tokens", ""}

// ceilSecond is d rounded up to a whole second: a reset is never early.
func ceilSecond(d time.Duration) time.Duration {
	if r := d % time.Second; r != 0 {
		d += time.Second - r
	}
	return d
}

// ceilMilli is d rounded up to a whole millisecond.
func ceilMilli(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r != 0 {
		d += time.Millisecond - r
	}
	return d
}

// stripUpstream removes the rate-limit headers an upstream API sent (its own limits, not the
// ones this middleware enforces), so that a client reads one account of its limits.
func stripUpstream(h http.Header) {
	for k := range h {
		l := strings.ToLower(k)
		if strings.HasPrefix(l, "x-ratelimit-") || strings.HasPrefix(l, "anthropic-ratelimit-") {
			delete(h, k)
		}
	}
}

// failure is a response the middleware writes itself, in the API's error format.
type failure struct {
	status  int
	kind    string // OpenAI's type and code, e.g. "rate_limit_exceeded"; mapped for Anthropic
	message string
}

// The kinds of failures, as OpenAI names them; anthropicKinds maps them.
const (
	kindRate     = "rate_limit_exceeded"
	kindQuota    = "insufficient_quota"
	kindInvalid  = "invalid_request_error"
	kindNotFound = "not_found"
	kindTooLarge = "request_too_large"
	kindServer   = "server_error"
)

var anthropicKinds = map[string]string{
	kindRate:     "rate_limit_error",
	kindInvalid:  "invalid_request_error",
	kindNotFound: "not_found_error",
	kindTooLarge: "request_too_large",
	kindServer:   "api_error",
}

// write answers f in api's error format:
//
//	OpenAI:    {"error":{"message":"...","type":"<kind>","param":null,"code":"<kind>"}}
//	Anthropic: {"type":"error","error":{"type":"<type>","message":"..."}}
//
// An exhausted quota's Anthropic type is billing_error (402) or permission_error (403).
func (m *Middleware) write(w http.ResponseWriter, api API, f failure) {
	var body []byte
	if api.anthropic() {
		t := anthropicKinds[f.kind]
		if f.kind == kindQuota {
			t = "billing_error"
			if f.status == http.StatusForbidden {
				t = "permission_error"
			}
		}
		body, _ = json.Marshal(struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}{Type: "error", Error: struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		}{t, f.message}})
	} else {
		type openAIError struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		}
		e := openAIError{Message: f.message, Type: f.kind}
		if f.kind == kindRate || f.kind == kindQuota {
			e.Code = &f.kind
		}
		body, _ = json.Marshal(struct {
			Error openAIError `json:"error"`
		}{e})
	}
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(f.status)
	w.Write(body)
}
