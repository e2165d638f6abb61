package llmlimit

import (
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"slices"
	"strings"
)

// API is the wire format of a request and its response.
type API uint8

const (
	// NotLLM is a request with no token accounting (Options.API): a GET or HEAD is served
	// unlimited, anything else refused 404.
	NotLLM API = iota
	// OpenAIChat is OpenAI's chat completions, POST .../chat/completions.
	OpenAIChat
	// OpenAIResponses is OpenAI's responses, POST .../responses.
	OpenAIResponses
	// AnthropicMessages is Anthropic's messages, POST .../messages.
	AnthropicMessages
)

// String returns the API's name: openai-chat, openai-responses, anthropic-messages or none.
func (a API) String() string {
	switch a {
	case OpenAIChat:
		return "openai-chat"
	case OpenAIResponses:
		return "openai-responses"
	case AnthropicMessages:
		return "anthropic-messages"
	}
	return "none"
}

// anthropic reports the API whose errors and headers are Anthropic's.
func (a API) anthropic() bool { return a == AnthropicMessages }

// ByPath is the default Options.API: a POST whose path ends in /chat/completions, /responses or
// /messages (after any prefix: /v1/chat/completions, /openai/v1/responses).
func ByPath(r *http.Request) API {
	if r.Method != http.MethodPost {
		return NotLLM
	}
	p := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case strings.HasSuffix(p, "/chat/completions"):
		return OpenAIChat
	case strings.HasSuffix(p, "/responses"):
		return OpenAIResponses
	case strings.HasSuffix(p, "/messages"):
		return AnthropicMessages
	}
	return NotLLM
}

// Request is what the middleware reads from a request's JSON body.
type Request struct {
	API   API
	Model string
	// MaxTokens is the request's bound on output tokens: max_completion_tokens, else
	// max_tokens (chat completions); max_output_tokens (responses); max_tokens (messages). 0
	// when the request sets none.
	MaxTokens int64
	// Choices is how many completions the request asks for (chat completions' n), each of up
	// to MaxTokens: 1 for the other APIs.
	Choices int64
	// Stream: the response is a server-sent event stream.
	Stream bool
	// IncludeUsage: a chat completions stream whose last chunk carries usage
	// (stream_options.include_usage). Responses and messages streams always end with usage.
	IncludeUsage bool
	// Text is the text of the prompt, what Options.Tokens counts: every string under the
	// request's messages (instructions, system, input, tools), but not images, audio or files,
	// whose tokens it leaves out.
	Text []byte
}

// errBody is a request body the middleware cannot read as the API's request.
var errBody = errors.New("llmlimit: the body is not a JSON object")

// request is the fields of the three APIs' requests that the middleware reads.
type request struct {
	Model               string `json:"model"`
	MaxTokens           *int64 `json:"max_tokens"`
	MaxCompletionTokens *int64 `json:"max_completion_tokens"`
	MaxOutputTokens     *int64 `json:"max_output_tokens"`
	Stream              bool   `json:"stream"`
	N                   *int64 `json:"n"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	// the prompt: chat's and messages' messages, responses' input and instructions,
	// messages' system, and the tools each may declare
	Messages     json.RawMessage `json:"messages"`
	Input        json.RawMessage `json:"input"`
	Instructions json.RawMessage `json:"instructions"`
	System       json.RawMessage `json:"system"`
	Tools        json.RawMessage `json:"tools"`
}

// ParseRequest reads body as a request of api. A body that is no JSON object of the API's
// fields (a max_tokens that is no integer, a stream that is no boolean) is an error.
func ParseRequest(api API, body []byte) (*Request, error) {
	var q request
	if err := json.Unmarshal(body, &q); err != nil {
		return nil, errors.Join(errBody, err)
	}
	out := &Request{API: api, Model: q.Model, Stream: q.Stream, Choices: 1}
	switch api {
	case OpenAIChat:
		switch {
		case q.MaxCompletionTokens != nil:
			out.MaxTokens = *q.MaxCompletionTokens
		case q.MaxTokens != nil:
			out.MaxTokens = *q.MaxTokens
		}
		out.IncludeUsage = q.StreamOptions != nil && q.StreamOptions.IncludeUsage
		if q.N != nil {
			out.Choices = *q.N
		}
	case OpenAIResponses:
		if q.MaxOutputTokens != nil {
			out.MaxTokens = *q.MaxOutputTokens
		}
	case AnthropicMessages:
		if q.MaxTokens != nil {
			out.MaxTokens = *q.MaxTokens
		}
	}
	if out.MaxTokens < 0 {
		return nil, errors.New("llmlimit: the request's maximum of output tokens is negative")
	}
	if out.Choices < 1 || out.Choices > 128 {
		return nil, errors.New("llmlimit: the request's n is not from 1 to 128")
	}
	for _, raw := range []json.RawMessage{q.Instructions, q.System, q.Messages, q.Input, q.Tools} {
		if len(raw) == 0 {
			continue
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, errors.Join(errBody, err)
		}
		out.Text = appendText(out.Text, v)
	}
	return out, nil
}

// skipped are the members whose strings are no text of the prompt: media (base64 data, URLs)
// and the names of things.
var skipped = map[string]bool{
	"type": true, "role": true, "id": true, "call_id": true, "tool_use_id": true,
	"image_url": true, "input_image": true, "source": true, "file": true, "input_audio": true,
	"image": true, "file_data": true, "file_id": true, "cache_control": true,
}

// appendText appends every string of v to text, each followed by a newline, skipping media.
func appendText(text []byte, v any) []byte {
	switch v := v.(type) {
	case string:
		return append(append(text, v...), '\n')
	case []any:
		for _, e := range v {
			text = appendText(text, e)
		}
	case map[string]any:
		// in the order of the names, so that a request's Text is always the same
		for _, k := range slices.Sorted(maps.Keys(v)) {
			if !skipped[k] {
				text = appendText(text, v[k])
			}
		}
	}
	return text
}

// Tokens counts the tokens of text for model, as the model's tokenizer would (Options.Tokens).
type Tokens func(model string, text []byte) int64

// Bytes4 is the default Tokens: a token per 4 bytes, rounded up. It is rough: about right for
// English prose on OpenAI's and Anthropic's tokenizers, low for code and for languages
// written in other scripts (a token per one to three bytes). Plug in a tokenizer where a budget
// must be close before the response's usage settles it.
func Bytes4(_ string, text []byte) int64 { return (int64(len(text)) + 3) / 4 }

// withUsage is body, a chat completions request, with stream_options.include_usage true, its
// other members kept.
func withUsage(body []byte) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return nil, err
	}
	opts := map[string]json.RawMessage{}
	if raw := obj["stream_options"]; len(raw) > 0 && string(raw) != "null" {
		if err := json.Unmarshal(raw, &opts); err != nil {
			return nil, err
		}
	}
	opts["include_usage"] = json.RawMessage("true")
	raw, err := json.Marshal(opts)
	if err != nil {
		return nil, err
	}
	obj["stream_options"] = raw
	return json.Marshal(obj)
}
