package llmlimit

import (
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// upstream is a fake OpenAI- and Anthropic-compatible API: chat completions, responses and
// messages, whole or streamed. Each answer has Words output tokens of "tok " (one token each by
// Bytes4), whatever the request's maximum, so that a stream can outrun its estimate; its
// usage's input is the prompt's Bytes4 count, Cached of it read from the cache.
type upstream struct {
	Words  int
	Cached int64
	Gap    time.Duration // between two events
	Usage  bool          // chat completions: a usage chunk even when not asked for (some servers send it)
	// counted by the fake
	cancelled atomic.Int64 // streams whose request ended before their last event
	finished  atomic.Int64 // streams that sent their last event
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	api := ByPath(r)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	req, err := ParseRequest(api, body)
	if err != nil || api == NotLLM {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(400)
		fmt.Fprint(w, `{"error":{"message":"bad request","type":"invalid_request_error"}}`)
		return
	}
	// the API's own rate-limit headers, which the middleware replaces with its own
	w.Header().Set("X-Ratelimit-Limit-Tokens", "999")
	w.Header().Set("Anthropic-Ratelimit-Tokens-Limit", "999")
	in := Bytes4("", req.Text)
	usage := Usage{Input: in - u.Cached, CacheRead: u.Cached, Output: int64(u.Words)}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, whole(api, req.Model, strings.Repeat("tok ", u.Words), usage))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	var out io.Writer = w
	flush := http.NewResponseController(w).Flush
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		// as a real API compresses what a client accepts compressed
		w.Header().Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(w)
		defer gz.Close()
		out, flush = gz, func() error { gz.Flush(); return http.NewResponseController(w).Flush() }
	}
	w.WriteHeader(200)
	events := streamed(api, req, u.Words, usage, u.Usage)
	for i, ev := range events {
		if r.Context().Err() != nil {
			u.cancelled.Add(1)
			return
		}
		if _, err := fmt.Fprint(out, ev); err != nil {
			u.cancelled.Add(1)
			return
		}
		flush()
		if u.Gap > 0 && i < len(events)-1 {
			select {
			case <-time.After(u.Gap):
			case <-r.Context().Done():
			}
		}
	}
	u.finished.Add(1)
}

// whole is a response's JSON body.
func whole(api API, model, text string, u Usage) string {
	q, _ := json.Marshal(text)
	switch api {
	case OpenAIChat:
		return fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":%q,`+
			`"choices":[{"index":0,"message":{"role":"assistant","content":%s},"finish_reason":"stop"}],`+
			`"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`,
			model, q, u.Input+u.CacheRead, u.Output, u.Input+u.CacheRead+u.Output, u.CacheRead)
	case OpenAIResponses:
		return fmt.Sprintf(`{"id":"resp_1","object":"response","status":"completed","model":%q,`+
			`"output":[{"type":"message","content":[{"type":"output_text","text":%s}]}],`+
			`"usage":{"input_tokens":%d,"output_tokens":%d,"input_tokens_details":{"cached_tokens":%d}}}`,
			model, q, u.Input+u.CacheRead, u.Output, u.CacheRead)
	}
	return fmt.Sprintf(`{"id":"msg_1","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":%s}],`+
		`"stop_reason":"end_turn","usage":{"input_tokens":%d,"output_tokens":%d,"cache_read_input_tokens":%d,"cache_creation_input_tokens":%d}}`,
		model, q, u.Input, u.Output, u.CacheRead, u.CacheWrite)
}

// streamed is a stream's events, each whole.
func streamed(api API, req *Request, words int, u Usage, alwaysUsage bool) []string {
	var out []string
	switch api {
	case OpenAIChat:
		chunk := func(delta, finish string) string {
			return fmt.Sprintf(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":%q,"choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`+"\n\n",
				req.Model, delta, finish)
		}
		out = append(out, chunk(`{"role":"assistant","content":""}`, "null"))
		for range words {
			out = append(out, chunk(`{"content":"tok "}`, "null"))
		}
		out = append(out, chunk(`{}`, `"stop"`))
		if req.IncludeUsage || alwaysUsage {
			out = append(out, fmt.Sprintf(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":%q,"choices":[],`+
				`"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`+"\n\n",
				req.Model, u.Input+u.CacheRead, u.Output, u.Input+u.CacheRead+u.Output, u.CacheRead))
		}
		out = append(out, "data: [DONE]\n\n")
	case OpenAIResponses:
		seq := 0
		ev := func(typ, data string) string {
			seq++
			return fmt.Sprintf("event: %s\ndata: {\"type\":%q,\"sequence_number\":%d,%s}\n\n", typ, typ, seq, data)
		}
		resp := fmt.Sprintf(`"response":{"id":"resp_1","object":"response","status":"in_progress","model":%q}`, req.Model)
		out = append(out, ev("response.created", resp), ev("response.in_progress", resp))
		for range words {
			out = append(out, ev("response.output_text.delta", `"item_id":"msg_1","output_index":0,"content_index":0,"delta":"tok "`))
		}
		out = append(out, ev("response.completed", fmt.Sprintf(`"response":{"id":"resp_1","object":"response","status":"completed","model":%q,`+
			`"usage":{"input_tokens":%d,"output_tokens":%d,"input_tokens_details":{"cached_tokens":%d}}}`,
			req.Model, u.Input+u.CacheRead, u.Output, u.CacheRead)))
	case AnthropicMessages:
		out = append(out,
			fmt.Sprintf("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":%q,\"content\":[],"+
				"\"usage\":{\"input_tokens\":%d,\"output_tokens\":1,\"cache_read_input_tokens\":%d,\"cache_creation_input_tokens\":%d}}}\n\n", req.Model, u.Input, u.CacheRead, u.CacheWrite),
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
			"event: ping\ndata: {\"type\": \"ping\"}\n\n")
		for range words {
			out = append(out, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"tok \"}}\n\n")
		}
		out = append(out, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
			fmt.Sprintf("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":%d}}\n\n", u.Output),
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	}
	return out
}

// chatBody is a chat completions request.
func chatBody(model string, maxTokens int, stream, usage bool, prompt string) string {
	p, _ := json.Marshal(prompt)
	s := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%s}]`, model, p)
	if maxTokens > 0 {
		s += fmt.Sprintf(`,"max_tokens":%d`, maxTokens)
	}
	if stream {
		s += `,"stream":true`
	}
	if usage {
		s += `,"stream_options":{"include_usage":true}`
	}
	return s + "}"
}

// messagesBody is a messages request.
func messagesBody(model string, maxTokens int, stream bool, prompt string) string {
	p, _ := json.Marshal(prompt)
	return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":%v,"system":"be brief","messages":[{"role":"user","content":[{"type":"text","text":%s}]}]}`,
		model, maxTokens, stream, p)
}

// responsesBody is a responses request.
func responsesBody(model string, maxTokens int, stream bool, prompt string) string {
	p, _ := json.Marshal(prompt)
	return fmt.Sprintf(`{"model":%q,"max_output_tokens":%d,"stream":%v,"input":%s}`, model, maxTokens, stream, p)
}
