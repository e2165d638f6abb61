package client_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/mock"
	"go.uber.org/mock/gomock"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/versions"
)

func TestCheck(t *testing.T) {
	speaks := versions.Embedded().Latest().Major()
	primary := mock.Result(mock.ValkeyArray(mock.ValkeyBlobString("master"), mock.ValkeyInt64(0), mock.ValkeyArray()))
	replica := mock.Result(mock.ValkeyArray(mock.ValkeyBlobString("slave"), mock.ValkeyBlobString("127.0.0.1"),
		mock.ValkeyInt64(6379), mock.ValkeyBlobString("connected"), mock.ValkeyInt64(1)))
	noACL := mock.Result(mock.ValkeyError("NOPERM this user has no permissions to run the 'role' command"))
	version := func(v string) valkey.ValkeyResult { return mock.Result(mock.ValkeyBlobString(v)) }
	notFound := mock.Result(mock.ValkeyError("ERR Function not found"))

	type node struct{ role, version valkey.ValkeyResult }
	tests := []struct {
		name  string
		give  map[string]node
		check func(t *testing.T, err error)
	}{
		{
			name: "every primary speaks",
			give: map[string]node{
				"10.0.0.1:6379": {primary, version(speaks + ".0.0")},
				"10.0.0.2:6379": {primary, version(speaks + ".7.3")},
				// a replica lagging behind is not the client's concern: peeks fall back
				"10.0.0.3:6379": {replica, notFound},
			},
			check: wantNil,
		},
		{
			name:  "ROLE refused: checked as a primary",
			give:  map[string]node{"10.0.0.1:6379": {noACL, version(speaks + ".0.0")}},
			check: wantNil,
		},
		{
			name: "another major",
			give: map[string]node{
				"10.0.0.1:6379": {primary, version(speaks + ".0.0")},
				"10.0.0.2:6379": {primary, version("99.0.0")},
			},
			check: func(t *testing.T, err error) {
				var ve *client.VersionError
				if !errors.As(err, &ve) || ve.Node != "10.0.0.2:6379" || ve.Version != "99.0.0" || ve.Want != speaks {
					t.Fatalf("got %v, want a *VersionError for 10.0.0.2:6379 running 99.0.0", err)
				}
				if errors.Is(err, client.ErrNotLoaded) {
					t.Errorf("%v is ErrNotLoaded", err)
				}
				want := "client: node 10.0.0.2:6379 runs ratelimit library 99.0.0, this client speaks " + speaks + ".x"
				if err.Error() != want {
					t.Errorf("got %q, want %q", err, want)
				}
			},
		},
		{
			name: "not a version",
			give: map[string]node{"10.0.0.1:6379": {primary, version("banana")}},
			check: func(t *testing.T, err error) {
				var ve *client.VersionError
				if !errors.As(err, &ve) || ve.Version != "banana" {
					t.Fatalf("got %v, want a *VersionError", err)
				}
			},
		},
		{
			name: "every failing node is named, in order",
			give: map[string]node{
				"10.0.0.3:6379": {primary, notFound},
				"10.0.0.1:6379": {primary, notFound},
				"10.0.0.2:6379": {primary, version(speaks + ".0.0")},
			},
			check: func(t *testing.T, err error) {
				if !errors.Is(err, client.ErrNotLoaded) {
					t.Fatalf("got %v, want ErrNotLoaded", err)
				}
				want := "client: node 10.0.0.1:6379 has no ratelimit library\n" +
					"client: node 10.0.0.3:6379 has no ratelimit library"
				if err.Error() != want {
					t.Errorf("got %q, want %q", err, want)
				}
			},
		},
		{
			name: "unreachable node",
			give: map[string]node{"10.0.0.1:6379": {
				mock.ErrorResult(&net.OpError{Op: "dial", Err: errors.New("connection refused")}),
				mock.ErrorResult(&net.OpError{Op: "dial", Err: errors.New("connection refused")}),
			}},
			check: func(t *testing.T, err error) {
				var oe *net.OpError
				if !errors.As(err, &oe) || !strings.Contains(err.Error(), "10.0.0.1:6379") {
					t.Fatalf("got %v, want the node's network error", err)
				}
			},
		},
		{
			name: "rl_version fails otherwise",
			give: map[string]node{"10.0.0.1:6379": {primary, mock.Result(mock.ValkeyError("NOPERM no fcall_ro"))}},
			check: func(t *testing.T, err error) {
				if err == nil || errors.Is(err, client.ErrNotLoaded) || !strings.Contains(err.Error(), "10.0.0.1:6379") {
					t.Fatalf("got %v", err)
				}
			},
		},
		{
			name: "no node",
			give: map[string]node{},
			check: func(t *testing.T, err error) {
				if err == nil {
					t.Fatal("no error")
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctrl := gomock.NewController(t)
			nodes := map[string]valkey.Client{}
			for addr, n := range tt.give {
				nc := mock.NewClient(ctrl)
				nc.EXPECT().DoMulti(gomock.Any(), mock.Match("ROLE"), mock.Match("FCALL_RO", "rl_version", "0")).
					Return([]valkey.ValkeyResult{n.role, n.version})
				nodes[addr] = nc
			}
			vk := mock.NewClient(ctrl)
			vk.EXPECT().Nodes().Return(nodes)
			tt.check(t, newLimiter(t, vk, client.Options{}).Check(context.Background()))
		})
	}
}

func wantNil(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
