package llmlimit

import (
	"encoding/json"
)

// Usage is the tokens a response used, as its usage reports them, split the same way for every
// API: OpenAI's prompt_tokens are Input plus CacheRead (its cached_tokens), Anthropic's
// input_tokens Input alone.
type Usage struct {
	Input      int64 // input tokens neither read from nor written to the prompt cache
	CacheRead  int64 // input tokens read from the cache (OpenAI's cached_tokens, Anthropic's cache_read_input_tokens)
	CacheWrite int64 // input tokens written to the cache (Anthropic's cache_creation_input_tokens)
	Output     int64 // output tokens, reasoning included
}

// openAIUsage is chat completions' usage, and responses' (input_tokens, output_tokens).
type openAIUsage struct {
	PromptTokens        *int64 `json:"prompt_tokens"`
	CompletionTokens    *int64 `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	InputTokens        *int64 `json:"input_tokens"`
	OutputTokens       *int64 `json:"output_tokens"`
	InputTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

// usage is u as a Usage, and whether it holds both counts.
func (u *openAIUsage) usage() (Usage, bool) {
	if u == nil {
		return Usage{}, false
	}
	in, out := u.PromptTokens, u.CompletionTokens
	var cached int64
	if d := u.PromptTokensDetails; d != nil {
		cached = d.CachedTokens
	}
	if in == nil {
		in, out = u.InputTokens, u.OutputTokens
		if d := u.InputTokensDetails; d != nil {
			cached = d.CachedTokens
		}
	}
	if in == nil || out == nil || *in < 0 || *out < 0 || cached < 0 || cached > *in {
		return Usage{}, false
	}
	return Usage{Input: *in - cached, CacheRead: cached, Output: *out}, true
}

// anthropicUsage is messages' usage. A stream's message_start has the input (and an output of
// a token or so), its message_delta the output so far.
type anthropicUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheReadInputTokens     int64  `json:"cache_read_input_tokens"`
	CacheCreationInputTokens int64  `json:"cache_creation_input_tokens"`
}

// input is the input side of u, and whether u has it.
func (u *anthropicUsage) input() (Usage, bool) {
	if u == nil || u.InputTokens == nil || *u.InputTokens < 0 || u.CacheReadInputTokens < 0 || u.CacheCreationInputTokens < 0 {
		return Usage{}, false
	}
	return Usage{Input: *u.InputTokens, CacheRead: u.CacheReadInputTokens, CacheWrite: u.CacheCreationInputTokens}, true
}

// output is u's output tokens, and whether it has them.
func (u *anthropicUsage) output() (int64, bool) {
	if u == nil || u.OutputTokens == nil || *u.OutputTokens < 0 {
		return 0, false
	}
	return *u.OutputTokens, true
}

// response is the fields of a whole (not streamed) response that carry its usage.
type response struct {
	Usage json.RawMessage `json:"usage"`
}

// ParseUsage reads the usage of a whole JSON response of api: chat completions' and responses'
// usage, messages' usage. ok is false when it has none (an error's body).
func ParseUsage(api API, body []byte) (u Usage, ok bool) {
	var r response
	if json.Unmarshal(body, &r) != nil || len(r.Usage) == 0 {
		return Usage{}, false
	}
	if api.anthropic() {
		var a anthropicUsage
		if json.Unmarshal(r.Usage, &a) != nil {
			return Usage{}, false
		}
		u, ok := a.input()
		out, okOut := a.output()
		u.Output = out
		return u, ok && okOut
	}
	var o openAIUsage
	if json.Unmarshal(r.Usage, &o) != nil {
		return Usage{}, false
	}
	return o.usage()
}
