package llmlimit

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
)

// stream follows a server-sent event stream of one API: the output text of each event, the
// usage it reports, and what a well-formed end written in its place must name.
type stream struct {
	api   API
	model string

	in       Usage // the input side of the usage, when inKnown
	inKnown  bool
	out      int64 // the output tokens the usage reports, when outKnown
	outKnown bool

	// what the end of a cut stream repeats
	id       string
	created  int64
	choices  []int // chat completions: the choices' indices seen, in order
	finished []int // those that ended
	open     int   // messages: the content block open, or -1
	// usageOnly: the event read last is a chat completions chunk of usage alone (no choices)
	usageOnly bool
	seq       int64 // responses: the last sequence_number passed on
	pending   int64 // responses: the sequence_number of the event read last
	response  json.RawMessage
}

// eventData is an event's data: its data lines joined by "\n", and its event field.
func eventData(ev []byte) (name string, data []byte) {
	for len(ev) > 0 {
		line := ev
		if i := bytes.IndexByte(ev, '\n'); i >= 0 {
			line, ev = ev[:i], ev[i+1:]
		} else {
			ev = nil
		}
		line = bytes.TrimSuffix(line, []byte{'\r'})
		field, value, _ := bytes.Cut(line, []byte{':'})
		value = bytes.TrimPrefix(value, []byte{' '})
		switch string(field) {
		case "data":
			if data != nil {
				data = append(data, '\n')
			}
			data = append(data, value...)
		case "event":
			name = string(value)
		}
	}
	return name, data
}

// eventEnd is the length of the first whole event in b, the blank line that ends it
// included, or -1. Lines end in "\n", "\r\n" or "\r".
func eventEnd(b []byte) int {
	end := -1
	for _, sep := range [...]string{"\n\n", "\r\n\r\n", "\r\r"} {
		if i := bytes.Index(b, []byte(sep)); i >= 0 && (end < 0 || i+len(sep) < end) {
			end = i + len(sep)
		}
	}
	return end
}

// chatChunk is a chat completions stream's chunk.
type chatChunk struct {
	ID      string `json:"id"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
			Reasoning        string `json:"reasoning"`
			Refusal          string `json:"refusal"`
			ToolCalls        []struct {
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *openAIUsage `json:"usage"`
}

// responsesEvent is a responses stream's event.
type responsesEvent struct {
	Type     string          `json:"type"`
	Seq      int64           `json:"sequence_number"`
	Delta    json.RawMessage `json:"delta"`
	Response json.RawMessage `json:"response"`
}

// messagesEvent is a messages stream's event.
type messagesEvent struct {
	Type    string `json:"type"`
	Index   int    `json:"index"`
	Message *struct {
		ID    string          `json:"id"`
		Model string          `json:"model"`
		Usage *anthropicUsage `json:"usage"`
	} `json:"message"`
	Delta *struct {
		Text        string `json:"text"`
		PartialJSON string `json:"partial_json"`
		Thinking    string `json:"thinking"`
	} `json:"delta"`
	Usage *anthropicUsage `json:"usage"`
}

// event reads one whole event, and returns the output text it carries (nil for none).
// Usage it reports is kept, not returned: it settles the stream, never cuts it.
func (s *stream) event(ev []byte) []byte {
	s.usageOnly = false
	_, data := eventData(ev)
	if len(data) == 0 || data[0] != '{' {
		return nil // a comment, a ping, [DONE]
	}
	switch s.api {
	case OpenAIChat:
		var c chatChunk
		if json.Unmarshal(data, &c) != nil {
			return nil
		}
		if c.ID != "" {
			s.id, s.created = c.ID, c.Created
		}
		if c.Model != "" {
			s.model = c.Model
		}
		u, ok := c.Usage.usage()
		if ok {
			s.in, s.inKnown, s.out, s.outKnown = u, true, u.Output, true
		}
		s.usageOnly = ok && len(c.Choices) == 0
		var text []byte
		for _, ch := range c.Choices {
			s.choice(ch.Index, ch.FinishReason != nil)
			d := &ch.Delta
			text = append(append(append(append(text, d.Content...), d.ReasoningContent...), d.Reasoning...), d.Refusal...)
			for _, tc := range d.ToolCalls {
				text = append(append(text, tc.Function.Name...), tc.Function.Arguments...)
			}
		}
		return text
	case OpenAIResponses:
		var e responsesEvent
		if json.Unmarshal(data, &e) != nil {
			return nil
		}
		s.pending = e.Seq
		if len(e.Response) > 0 {
			s.response = e.Response
			var r struct {
				Usage *openAIUsage `json:"usage"`
			}
			if json.Unmarshal(e.Response, &r) == nil {
				if u, ok := r.Usage.usage(); ok {
					s.in, s.inKnown, s.out, s.outKnown = u, true, u.Output, true
				}
			}
		}
		if strings.HasSuffix(e.Type, ".delta") && len(e.Delta) > 0 && e.Delta[0] == '"' {
			var text string
			if json.Unmarshal(e.Delta, &text) == nil {
				return []byte(text)
			}
		}
		return nil
	case AnthropicMessages:
		var e messagesEvent
		if json.Unmarshal(data, &e) != nil {
			return nil
		}
		switch e.Type {
		case "message_start":
			if e.Message != nil {
				s.id = e.Message.ID
				if e.Message.Model != "" {
					s.model = e.Message.Model
				}
				if u, ok := e.Message.Usage.input(); ok {
					s.in, s.inKnown = u, true
				}
			}
		case "content_block_start":
			s.open = e.Index
		case "content_block_stop":
			s.open = -1
		case "content_block_delta":
			if d := e.Delta; d != nil {
				return append(append([]byte(d.Text), d.PartialJSON...), d.Thinking...)
			}
		case "message_delta":
			// Its output_tokens are the stream's so far (cumulative); some servers repeat the
			// input there too.
			if out, ok := e.Usage.output(); ok {
				s.out, s.outKnown = out, true
			}
			if u, ok := e.Usage.input(); ok && !s.inKnown {
				s.in, s.inKnown = u, true
			}
		}
	}
	return nil
}

// sent notes that the event read last was passed on.
func (s *stream) sent() { s.seq = max(s.seq, s.pending) }

// choice notes a chat completion's choice seen, and whether it finished.
func (s *stream) choice(i int, finished bool) {
	if !containsInt(s.choices, i) {
		s.choices = append(s.choices, i)
	}
	if finished && !containsInt(s.finished, i) {
		s.finished = append(s.finished, i)
	}
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Cut is why the middleware ended a stream early, sent in the last event it writes (the
// member "rlfn" of OpenAI's last chunk or response, of Anthropic's message_delta).
type Cut struct {
	// Reason is "budget" (a limit had no more tokens for the stream) or "limiter" (the
	// Limiter failed to grant more, and the stream was cut rather than run unmetered).
	Reason  string `json:"reason"`
	Message string `json:"message"`
	// OutputTokens are the output tokens the client received, as the middleware counted
	// them (Options.Tokens): what it is charged for, beside its input.
	OutputTokens int64 `json:"output_tokens"`
}

// end is the well-formed end of a stream cut by the middleware, in place of the rest of it:
//
//	chat completions: a chunk whose every unfinished choice has finish_reason "length" and
//	  an empty delta, with the member "rlfn", then "data: [DONE]";
//	responses: a response.incomplete event, the response's status "incomplete" and its
//	  incomplete_details' reason "max_output_tokens", with "rlfn";
//	messages: content_block_stop for a block left open, a message_delta with stop_reason
//	  "max_tokens", usage.output_tokens and "rlfn", then message_stop.
func (s *stream) end(c Cut) []byte {
	cut, _ := json.Marshal(c)
	var b []byte
	switch s.api {
	case OpenAIChat:
		b = append(b, `data: {"id":`...)
		b = appendJSONString(b, s.id)
		b = append(b, `,"object":"chat.completion.chunk","created":`...)
		b = strconv.AppendInt(b, s.created, 10)
		b = append(b, `,"model":`...)
		b = appendJSONString(b, s.model)
		b = append(b, `,"choices":[`...)
		n := 0
		choices := s.choices
		if len(choices) == 0 {
			choices = []int{0}
		}
		for _, i := range choices {
			if containsInt(s.finished, i) {
				continue
			}
			if n > 0 {
				b = append(b, ',')
			}
			n++
			b = strconv.AppendInt(append(b, `{"index":`...), int64(i), 10)
			b = append(b, `,"delta":{},"finish_reason":"length"}`...)
		}
		b = append(append(append(b, `],"rlfn":`...), cut...), "}\n\ndata: [DONE]\n\n"...)
	case OpenAIResponses:
		resp := map[string]any{}
		if len(s.response) > 0 {
			_ = json.Unmarshal(s.response, &resp)
		}
		resp["status"] = "incomplete"
		resp["incomplete_details"] = map[string]string{"reason": "max_output_tokens"}
		if _, ok := resp["object"]; !ok {
			resp["object"] = "response"
		}
		if _, ok := resp["model"]; !ok && s.model != "" {
			resp["model"] = s.model
		}
		data, _ := json.Marshal(map[string]any{"type": "response.incomplete", "sequence_number": s.seq + 1,
			"response": resp, "rlfn": json.RawMessage(cut)})
		b = append(append(append(b, "event: response.incomplete\ndata: "...), data...), "\n\n"...)
	case AnthropicMessages:
		if s.open >= 0 {
			b = append(b, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":"...)
			b = append(strconv.AppendInt(b, int64(s.open), 10), "}\n\n"...)
		}
		b = append(b, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":"...)
		b = strconv.AppendInt(b, c.OutputTokens, 10)
		b = append(append(append(b, `},"rlfn":`...), cut...), "}\n\n"...)
		b = append(b, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"...)
	}
	return b
}

func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s)
	return append(b, q...)
}
