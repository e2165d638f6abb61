package llmlimit

import (
	"fmt"
	"testing"
)

func TestParseRequest(t *testing.T) {
	for _, tt := range []struct {
		api  API
		give string
		want string // fmt of model, max, choices, stream, include usage, text
	}{
		{OpenAIChat, `{"model":"m","max_tokens":5,"max_completion_tokens":7,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`,
			"m 7 1 true true \"hi\\n\""},
		{OpenAIChat, `{"model":"m","max_tokens":5,"n":2,"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:xyz"}}]}]}`,
			"m 5 2 false false \"a\\n\""},
		{OpenAIChat, `{"model":"m","messages":[],"tools":[{"type":"function","function":{"name":"f","description":"d"}}]}`,
			"m 0 1 false false \"d\\nf\\n\""},
		{OpenAIResponses, `{"model":"m","max_output_tokens":9,"max_tokens":3,"instructions":"be","input":"hi"}`,
			"m 9 1 false false \"be\\nhi\\n\""},
		{AnthropicMessages, `{"model":"c","max_tokens":4,"max_completion_tokens":8,"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"QUJD"}},{"type":"text","text":"q"}]}]}`,
			"c 4 1 false false \"s\\nq\\n\""},
	} {
		r, err := ParseRequest(tt.api, []byte(tt.give))
		if err != nil {
			t.Errorf("%s: %v", tt.give, err)
			continue
		}
		got := fmt.Sprintf("%s %d %d %v %v %q", r.Model, r.MaxTokens, r.Choices, r.Stream, r.IncludeUsage, r.Text)
		if got != tt.want {
			t.Errorf("%s:\n got %s\nwant %s", tt.give, got, tt.want)
		}
	}
	for _, bad := range []string{`[]`, `{"max_tokens":"5"}`, `{"max_tokens":-1}`, `{"stream":1}`, `{"n":0}`, `{"n":1000}`, `{"messages":{`} {
		if _, err := ParseRequest(OpenAIChat, []byte(bad)); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

func TestParseUsage(t *testing.T) {
	for _, tt := range []struct {
		api  API
		give string
		want string // "" for none
	}{
		{OpenAIChat, `{"usage":{"prompt_tokens":10,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":4}}}`, "{6 4 0 5}"},
		{OpenAIChat, `{"usage":{"prompt_tokens":10,"completion_tokens":5}}`, "{10 0 0 5}"},
		{OpenAIResponses, `{"usage":{"input_tokens":10,"output_tokens":5,"input_tokens_details":{"cached_tokens":10}}}`, "{0 10 0 5}"},
		{AnthropicMessages, `{"usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":3,"cache_creation_input_tokens":2}}`, "{10 3 2 5}"},
		{OpenAIChat, `{"usage":{"prompt_tokens":10,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":11}}}`, ""},
		{OpenAIChat, `{"usage":{"prompt_tokens":-1,"completion_tokens":5}}`, ""},
		{OpenAIChat, `{"usage":null}`, ""},
		{AnthropicMessages, `{"usage":{"input_tokens":10}}`, ""},
		{OpenAIChat, `{"error":{"message":"no"}}`, ""},
		{OpenAIChat, `not json`, ""},
	} {
		u, ok := ParseUsage(tt.api, []byte(tt.give))
		got := ""
		if ok {
			got = fmt.Sprint(u)
		}
		if got != tt.want {
			t.Errorf("%s: %q, want %q", tt.give, got, tt.want)
		}
	}
}

func TestEventEnd(t *testing.T) {
	for _, tt := range []struct {
		give string
		want int
	}{
		{"data: x\n\n", 9},
		{"data: x\r\n\r\ndata: y\n\n", 11},
		{"data: x\r\rmore", 9},
		{"data: x\n", -1},
		{"data: x\r\n", -1},
		{"event: a\ndata: x\n\ndata: y\n\n", 18},
		{"", -1},
	} {
		if got := eventEnd([]byte(tt.give)); got != tt.want {
			t.Errorf("%q: %d, want %d", tt.give, got, tt.want)
		}
	}
}

// An event's data lines are joined, whatever their line ends; its name is its event field.
func TestEventData(t *testing.T) {
	name, data := eventData([]byte("event: message_delta\r\ndata: {\"a\":\r\ndata:1}\r\n: comment\r\n\r\n"))
	if name != "message_delta" || string(data) != "{\"a\":\n1}" {
		t.Errorf("%q %q", name, data)
	}
}
