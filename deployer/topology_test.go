package deployer

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseClusterNodes(t *testing.T) {
	tests := []struct {
		name      string
		give      string
		wantNodes []Node
		wantErr   string
	}{
		{
			name: "3 primaries, 3 replicas, one slotless primary",
			give: `c1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460
c2 127.0.0.1:7002@17002 master - 0 1700000000000 2 connected 5461-10922
c3 127.0.0.1:10003@20003 master - 0 1700000000000 3 connected 10923-16383
r1 127.0.0.1:7004@17004 slave c1 0 1700000000000 1 connected
r2 127.0.0.1:7005@17005 slave c2 0 1700000000000 2 connected
r3 127.0.0.1:7006@17006 slave c3 0 1700000000000 3 connected
n4 127.0.0.1:7007@17007 master - 0 1700000000000 4 connected
`,
			wantNodes: []Node{
				{Addr: "127.0.0.1:7001", ID: "c1", Role: RolePrimary, Slots: 5461},
				{Addr: "127.0.0.1:7002", ID: "c2", Role: RolePrimary, Slots: 5462},
				{Addr: "127.0.0.1:7007", ID: "n4", Role: RolePrimary},
				{Addr: "127.0.0.1:10003", ID: "c3", Role: RolePrimary, Slots: 5461},
				{Addr: "127.0.0.1:7004", ID: "r1", Role: RoleReplica, Primary: "127.0.0.1:7001"},
				{Addr: "127.0.0.1:7005", ID: "r2", Role: RoleReplica, Primary: "127.0.0.1:7002"},
				{Addr: "127.0.0.1:7006", ID: "r3", Role: RoleReplica, Primary: "127.0.0.1:10003"},
			},
		},
		{
			name: "failed, pfail, handshake and noaddr nodes are listed, down",
			give: `c1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-100 200 300-16383
c2 127.0.0.1:7002@17002 master,fail - 0 0 2 disconnected
r2 127.0.0.1:7005@17005 master - 0 0 5 connected 101-199 201-299
h1 127.0.0.1:7008@17008 handshake - 0 0 0 disconnected
x1 :0@0 master,noaddr - 0 0 0 disconnected
p1 127.0.0.1:7009@17009 slave,fail? c2 0 0 2 connected
`,
			wantNodes: []Node{
				{Addr: "127.0.0.1:0", ID: "x1", Role: RolePrimary, Down: "flagged noaddr: the cluster knows no address for it"},
				{Addr: "127.0.0.1:7001", ID: "c1", Role: RolePrimary, Slots: 101 + 1 + 16084},
				{Addr: "127.0.0.1:7002", ID: "c2", Role: RolePrimary, Down: "flagged fail by the cluster"},
				{Addr: "127.0.0.1:7005", ID: "r2", Role: RolePrimary, Slots: 99 + 99},
				{Addr: "127.0.0.1:7008", ID: "h1", Role: RolePrimary, Down: "still in the cluster handshake"},
				{Addr: "127.0.0.1:7009", ID: "p1", Role: RoleReplica, Primary: "127.0.0.1:7002", Down: "flagged pfail (not answering the node asked)"},
			},
		},
		{
			name: "hostnames, migrating slots, an address not yet learned, Valkey's role names",
			give: `c1 :7001@17001,node-a myself,primary - 0 0 1 connected 0-8191 [8192->-c2]
c2 127.0.0.1:7002@17002,node-b primary - 0 0 2 connected 8192-16383 [8192-<-c1]
r1 127.0.0.1:7003@17003 replica c1 0 0 1 connected
`,
			wantNodes: []Node{
				{Addr: "127.0.0.1:7001", ID: "c1", Role: RolePrimary, Slots: 8192},
				{Addr: "127.0.0.1:7002", ID: "c2", Role: RolePrimary, Slots: 8192},
				{Addr: "127.0.0.1:7003", ID: "r1", Role: RoleReplica, Primary: "127.0.0.1:7001"},
			},
		},
		{
			name: "IPv6",
			give: "c1 ::1:7001@17001 myself,master - 0 0 1 connected 0-16383\n",
			wantNodes: []Node{
				{Addr: "[::1]:7001", ID: "c1", Role: RolePrimary, Slots: 16384},
			},
		},
		{
			name: "a replica of a node not in the view",
			give: "c1 127.0.0.1:7001@17001 myself,slave zz 0 0 1 connected\n",
			wantNodes: []Node{
				{Addr: "127.0.0.1:7001", ID: "c1", Role: RoleReplica, Primary: "zz"},
			},
		},
		{name: "short line", give: "c1 127.0.0.1:7001@17001 master\n", wantErr: "has 3 fields"},
		// As Valkey 8.0 prints a node whose cluster-announce-ip holds a line break.
		{
			name:    "a node's address cut by a line break",
			give:    "c1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-16383\nr1 1.2.3.4\nX 6.6.6.6:1@2 master:7004@17004 slave c1 0 0 1 disconnected\n",
			wantErr: `line has 2 fields, want at least 8: "r1 1.2.3.4" (a node announces an address holding a line break (cluster-announce-ip)?)`,
		},
		{name: "no port", give: "c1 127.0.0.1@17001 master - 0 0 1 connected\n", wantErr: "has no port"},
		{name: "bad slot", give: "c1 127.0.0.1:7001@17001 master - 0 0 1 connected 10-x\n", wantErr: "bad slot range"},
		{name: "no role", give: "c1 127.0.0.1:7001@17001 myself - 0 0 1 connected\n", wantErr: "neither primary nor replica"},
		{name: "slot past the last", give: "c1 127.0.0.1:7001@17001 master - 0 0 1 connected 0-16384\n", wantErr: "bad slot range"},
		// A node's announced address with line breaks in it writes lines of its own (here,
		// as Valkey 8.0 prints it, with a line claiming every slot): refused.
		{
			name: "a line claims another's slots",
			give: "c1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-16383\n" +
				"r1 h:1 master - 0 0 0 c 0-16383\nX 6.6.6.6:7004@17004 slave c1 0 0 1 connected\n",
			wantErr: "gives slot 0 two owners: a node announces an address holding a line break",
		},
		{
			name:    "a node twice",
			give:    "c1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-16383\nc1 6.6.6.6:1@2 master - 0 0 1 connected\n",
			wantErr: "lists node c1 twice",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topo, err := parseClusterNodes(tt.give, "127.0.0.1")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "deployer: ") {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !topo.Cluster || !reflect.DeepEqual(topo.Nodes, tt.wantNodes) {
				t.Errorf("nodes:\n got %+v\nwant %+v", topo.Nodes, tt.wantNodes)
			}
		})
	}
}

func TestParseReplication(t *testing.T) {
	tests := []struct {
		name    string
		give    string
		want    replication
		wantErr string
	}{
		{
			name: "primary with two replicas",
			give: "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n" +
				"slave0:ip=127.0.0.1,port=7002,state=online,offset=42,lag=0\r\n" +
				"slave1:ip=10.0.0.2,port=7003,state=wait_bgsave,offset=0,lag=0\r\n" +
				"slave_read_repl_offset:42\r\nmaster_failover_state:no-failover\r\n",
			want: replication{Role: RolePrimary, Replicas: []string{"127.0.0.1:7002", "10.0.0.2:7003"}},
		},
		{
			name: "primary without replicas",
			give: "# Replication\nrole:master\nconnected_slaves:0\n",
			want: replication{Role: RolePrimary},
		},
		{
			name: "replica",
			give: "# Replication\r\nrole:slave\r\nmaster_host:127.0.0.1\r\nmaster_port:7001\r\nmaster_link_status:up\r\nslave_read_only:1\r\nconnected_slaves:0\r\n",
			want: replication{Role: RoleReplica, Primary: "127.0.0.1:7001"},
		},
		{
			name: "replica with a replica of its own",
			give: "role:slave\nmaster_host:::1\nmaster_port:7001\nconnected_slaves:1\nslave0:ip=::1,port=7003,state=online,offset=1,lag=0\n",
			want: replication{Role: RoleReplica, Primary: "[::1]:7001", Replicas: []string{"[::1]:7003"}},
		},
		{name: "no role", give: "# Replication\nconnected_slaves:0\n", wantErr: "has no role"},
		{name: "unknown role", give: "role:sentinel\n", wantErr: `unknown role "sentinel"`},
		{name: "replica without primary", give: "role:slave\n", wantErr: "without master_host"},
		{name: "replica line without port", give: "role:master\nslave0:ip=127.0.0.1,state=online\n", wantErr: "slave0 has no ip or port"},
		// What Valkey 8.0 prints when a replica's replica-announce-ip holds line breaks: it
		// must not make the primary a replica of another server, nor add replicas.
		{
			name: "a replica's address rewrites the role",
			give: "# Replication\r\nrole:master\r\nconnected_slaves:1\r\nslave0:ip=127.0.0.1,port=27201\r\nrole:slave\r\nmaster_host:127.0.0.1\r\n" +
				"master_port:27201\r\nx,port=27102,state=wait_bgsave,offset=0,lag=0,type=replica\r\nreplicas_waiting_psync:0\r\n",
			wantErr: "INFO replication holds role twice: a replica announces an address holding a line break",
		},
		{
			name:    "a replica's address adds a replica",
			give:    "role:master\nconnected_slaves:1\nslave0:ip=10.0.0.2,port=7002\nslave1:ip=6.6.6.6,port=1\nx,port=7002,state=online\n",
			wantErr: "lists slave1 with connected_slaves:1",
		},
		{
			name:    "a replica's address replaces another's",
			give:    "role:master\nconnected_slaves:2\nslave0:ip=10.0.0.2,port=7002\nslave1:ip=6.6.6.6,port=1\nx,port=7002,state=online\nslave1:ip=10.0.0.3,port=7003\n",
			wantErr: "holds slave1 twice",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseReplication(tt.give)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestSortNodes(t *testing.T) {
	give := []Node{
		{Addr: "127.0.0.1:10001", Role: RoleReplica},
		{Addr: "127.0.0.1:7002", Role: RoleReplica},
		{Addr: "127.0.0.2:7000", Role: RolePrimary},
		{Addr: "127.0.0.1:10000", Role: RolePrimary},
		{Addr: "127.0.0.1:9000", Role: RolePrimary},
	}
	want := []string{"127.0.0.1:9000", "127.0.0.1:10000", "127.0.0.2:7000", "127.0.0.1:7002", "127.0.0.1:10001"}
	sortNodes(give)
	var got []string
	for _, n := range give {
		got = append(got, n.Addr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
