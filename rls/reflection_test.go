package rls_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/envoyconf"
	"github.com/rlfn/rlfn/rls"
)

// A client with no .proto file, as grpcurl is, lists the services through reflection, learns
// their types from it, and calls ShouldRateLimit and the health check with them (the hand
// calls envoy.md shows). An unknown domain needs no backend: the service asks none.
func TestReflection(t *testing.T) {
	cfg, err := envoyconf.Load([]envoyconf.File{{Name: "c.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")}}, false)
	if err != nil {
		t.Fatal(err)
	}
	srv := rls.NewServer(rls.NewService(func(string) *client.Limiter { return nil }, cfg, rls.Options{}), rls.ServerOptions{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l, nil) }()
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(req *reflectionpb.ServerReflectionRequest) *reflectionpb.ServerReflectionResponse {
		t.Helper()
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if e := resp.GetErrorResponse(); e != nil {
			t.Fatalf("%v: %s", req, e.ErrorMessage)
		}
		return resp
	}
	// grpcurl list
	var names []string
	for _, s := range ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}).GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	for _, want := range []string{"envoy.service.ratelimit.v3.RateLimitService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
		if !slices.Contains(names, want) {
			t.Errorf("list: %v, want %s", names, want)
		}
	}
	// grpcurl -d JSON ... SERVICE/METHOD: the types from reflection alone. The stream sends
	// each file once, so every file asked for adds to one set.
	set := &descriptorpb.FileDescriptorSet{}
	method := func(service, name string) protoreflect.MethodDescriptor {
		t.Helper()
		resp := ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: service}})
		for _, b := range resp.GetFileDescriptorResponse().GetFileDescriptorProto() {
			fd := &descriptorpb.FileDescriptorProto{}
			if err := proto.Unmarshal(b, fd); err != nil {
				t.Fatal(err)
			}
			set.File = append(set.File, fd)
		}
		files, err := protodesc.NewFiles(set)
		if err != nil {
			t.Fatalf("%s: the descriptors reflection sent do not resolve: %v", service, err)
		}
		d, err := files.FindDescriptorByName(protoreflect.FullName(service))
		if err != nil {
			t.Fatal(err)
		}
		return d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(name))
	}
	call := func(m protoreflect.MethodDescriptor, in string) string {
		t.Helper()
		req := dynamicpb.NewMessage(m.Input())
		if err := protojson.Unmarshal([]byte(in), req); err != nil {
			t.Fatal(err)
		}
		resp := dynamicpb.NewMessage(m.Output())
		if err := conn.Invoke(ctx, "/"+string(m.Parent().FullName())+"/"+string(m.Name()), req, resp); err != nil {
			t.Fatalf("%s: %v", m.FullName(), err)
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		return compactJSON(t, out)
	}
	srl := method("envoy.service.ratelimit.v3.RateLimitService", "ShouldRateLimit")
	if got := call(srl, `{"domain": "nowhere", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}`); got != `{"overallCode":"OK","statuses":[{"code":"OK"}]}` {
		t.Errorf("ShouldRateLimit: %s", got)
	}
	check := method("grpc.health.v1.Health", "Check")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got := call(check, `{"service": "envoy.service.ratelimit.v3.RateLimitService"}`)
		if got == `{"status":"SERVING"}` {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health: %s", got)
		}
	}
}

// compactJSON is data without protojson's random spaces.
func compactJSON(t *testing.T, data []byte) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, data); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
