package deployer

import (
	"encoding/hex"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestParseClusterNodes(t *testing.T) {
	// give names nodes short (c1, r1) for reading: withIDs makes them node IDs, as servers
	// print them, in give and in wantNodes; raw gives are parsed as they are.
	tests := []struct {
		name      string
		give      string
		raw       bool
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
		// Real replies in transient states, as Valkey 8.0.1 and Redis 7.0.15 print them (IDs
		// shortened): none may be refused, whatever checks the parser grows.
		{
			name: "Valkey 8.0 mid-migration, a MEET in its handshake, hostnames",
			give: "cf43 127.0.0.1:7802@17802,host2.example master - 0 1795480421075 3 connected 10923-16383\n" +
				"756b 127.0.0.1:7803@17803,host3.example slave cf43 0 1795480421075 3 connected\n" +
				"a2b0 127.0.0.1:7850@17850 handshake - 0 0 0 disconnected\n" +
				"5a95 127.0.0.1:7801@17801,host1.example master - 0 1795480421075 2 connected 5461-10922\n" +
				"fd46 127.0.0.1:7800@17800,host0.example myself,master - 0 0 1 connected 0-5460 [0->-5a95]\n",
			wantNodes: []Node{
				{Addr: "127.0.0.1:7800", ID: "fd46", Role: RolePrimary, Slots: 5461},
				{Addr: "127.0.0.1:7801", ID: "5a95", Role: RolePrimary, Slots: 5462},
				{Addr: "127.0.0.1:7802", ID: "cf43", Role: RolePrimary, Slots: 5461},
				{Addr: "127.0.0.1:7850", ID: "a2b0", Role: RolePrimary, Down: "still in the cluster handshake"},
				{Addr: "127.0.0.1:7803", ID: "756b", Role: RoleReplica, Primary: "127.0.0.1:7802"},
			},
		},
		{
			name: "Redis 7.0 with a primary killed: pfail, its slots still its own, a slot moved by hand",
			give: "aa20 127.0.0.1:7904@17904,host4.example slave b248 0 1795480425649 3 connected\n" +
				"6887 127.0.0.1:7903@17903,host3.example master - 0 1795480425648 8 connected 0 5461-10922\n" +
				"1b8c 127.0.0.1:7901@17901,host1.example slave 6887 0 1795480425649 8 connected\n" +
				"ac80 127.0.0.1:7905@17905,host5.example myself,slave 8927 0 1795480425000 1 connected\n" +
				"b248 127.0.0.1:7902@17902,host2.example master,fail? - 1795480424636 1795480424126 3 disconnected 10923-16383\n" +
				"8927 127.0.0.1:7900@17900,host0.example master - 0 1795480425345 1 connected 1-5460\n",
			wantNodes: []Node{
				{Addr: "127.0.0.1:7900", ID: "8927", Role: RolePrimary, Slots: 5460},
				{Addr: "127.0.0.1:7902", ID: "b248", Role: RolePrimary, Slots: 5461, Down: "flagged pfail (not answering the node asked)"},
				{Addr: "127.0.0.1:7903", ID: "6887", Role: RolePrimary, Slots: 5463},
				{Addr: "127.0.0.1:7901", ID: "1b8c", Role: RoleReplica, Primary: "127.0.0.1:7903"},
				{Addr: "127.0.0.1:7904", ID: "aa20", Role: RoleReplica, Primary: "127.0.0.1:7902"},
				{Addr: "127.0.0.1:7905", ID: "ac80", Role: RoleReplica, Primary: "127.0.0.1:7900"},
			},
		},
		{
			name: "Valkey 8.0 with a node replaced at its address: the old ID lingers, fail and noaddr",
			give: "68a6 :0@0,host2.example master,fail,noaddr - 1795480736102 1795480735093 3 disconnected\n" +
				"dd6d 127.0.0.1:8100@18100,host0.example myself,master - 0 0 1 connected 0-16383\n" +
				"e9e5 127.0.0.1:8102@18102 master - 0 1795480914051 0 connected\n",
			wantNodes: []Node{
				{Addr: "127.0.0.1:0", ID: "68a6", Role: RolePrimary, Down: "flagged fail by the cluster"},
				{Addr: "127.0.0.1:8100", ID: "dd6d", Role: RolePrimary, Slots: 16384},
				{Addr: "127.0.0.1:8102", ID: "e9e5", Role: RolePrimary},
			},
		},
		{
			name: "Valkey 8.0 over IPv6",
			give: "70af ::1:7950@17950 master - 0 1795480644072 1 connected 0-16383\n" +
				"b79d ::1:7951@17951 myself,slave 70af 0 0 1 connected\n",
			wantNodes: []Node{
				{Addr: "[::1]:7950", ID: "70af", Role: RolePrimary, Slots: 16384},
				{Addr: "[::1]:7951", ID: "b79d", Role: RoleReplica, Primary: "[::1]:7950"},
			},
		},
		{name: "short line", give: "c1 127.0.0.1:7001@17001 master\n", wantErr: "has 3 fields"},
		// As Valkey 8.0 prints a node whose cluster-announce-ip holds a line break.
		{
			name:    "a node's address cut by a line break",
			give:    "c1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-16383\nr1 1.2.3.4\nX 6.6.6.6:1@2 master:7004@17004 slave c1 0 0 1 disconnected\n",
			wantErr: `line has 2 fields, want at least 8: "` + nodeID("r1") + ` 1.2.3.4" (a node announces an address holding a line break (cluster-announce-ip)?)`,
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
			wantErr: "lists node " + nodeID("c1") + " twice",
		},
		// A node announcing an address holding a line break writes a whole line (as Valkey 8.0
		// prints it, in the 45 bytes it keeps of an address): its ID, and the primary of the
		// line it cuts short, are not node IDs.
		{
			name: "an injected line of a replica to dial",
			raw:  true,
			give: "dd6d8b42efb537b97c22b97afd6160ff9f4d263c 127.0.0.1:8100@18100 myself,master - 0 0 1 connected 0-16383\n" +
				"e20240a69f01483b86961b9540744e8b9e461603 1:1@2 slave c 0 0 1 c\n" +
				"Z 6.6.6.6:8105@18105,host5.example slave dd6d8b42efb537b97c22b97afd6160ff9f4d263c 1795481043212 1795481043108 1 disconnected\n",
			wantErr: `node e20240a69f01483b86961b9540744e8b9e461603 replicates "c", not a node ID`,
		},
		{
			name: "an injected line alone",
			raw:  true,
			give: "dd6d8b42efb537b97c22b97afd6160ff9f4d263c 127.0.0.1:8100@18100 myself,master - 0 0 1 connected 0-16383\n" +
				"Z 6.6.6.6:8105@18105,host5.example slave dd6d8b42efb537b97c22b97afd6160ff9f4d263c 1795481043212 1795481043108 1 disconnected\n",
			wantErr: `line starts with "Z", not a node ID`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			give, want := tt.give, tt.wantNodes
			if !tt.raw {
				give, want = withIDs(give), wantIDs(want)
			}
			topo, err := parseClusterNodes(give, "127.0.0.1")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "deployer: ") {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !topo.Cluster || !reflect.DeepEqual(topo.Nodes, want) {
				t.Errorf("nodes:\n got %+v\nwant %+v", topo.Nodes, want)
			}
		})
	}
}

// nodeID is the node ID a test's short name stands for: its hex, padded to 40 digits.
func nodeID(name string) string {
	h := hex.EncodeToString([]byte(name))
	return h + strings.Repeat("0", 40-len(h))
}

// withIDs makes the short names of a CLUSTER NODES text (each line's first field, and its
// fourth unless "-") node IDs.
func withIDs(text string) string {
	var b strings.Builder
	for line := range strings.Lines(text) {
		body, nl := strings.CutSuffix(line, "\n")
		f := strings.Split(body, " ")
		if f[0] != "" {
			f[0] = nodeID(f[0])
		}
		if len(f) > 3 && f[3] != "-" {
			f[3] = nodeID(f[3])
		}
		b.WriteString(strings.Join(f, " "))
		if nl {
			b.WriteString("\n")
		}
	}
	return b.String()
}

// wantIDs is nodes with their short names made node IDs, a primary named by its ID (one
// missing from the view) included.
func wantIDs(nodes []Node) []Node {
	out := slices.Clone(nodes)
	for i := range out {
		out[i].ID = nodeID(out[i].ID)
		if out[i].Primary != "" && !strings.Contains(out[i].Primary, ":") {
			out[i].Primary = nodeID(out[i].Primary)
		}
	}
	return out
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
		// Real replies in transient states, as Valkey 8.0.1 and Redis 7.0.15 print them while
		// replicas connect (a replica's RDB channel is listed on its own with dual-channel
		// replication) and sync: none may be refused, whatever checks the parser grows.
		{
			name: "Valkey 8.0 primary, two replicas each listed twice (RDB and main channel)",
			give: "# Replication\r\nrole:master\r\nconnected_slaves:4\r\n" +
				"slave0:ip=127.0.0.1,port=7602,state=wait_bgsave,offset=0,lag=0,type=rdb-channel\r\n" +
				"slave1:ip=127.0.0.1,port=7603,state=wait_bgsave,offset=0,lag=0,type=rdb-channel\r\n" +
				"slave2:ip=127.0.0.1,port=7603,state=bg_transfer,offset=0,lag=0,type=main-channel\r\n" +
				"slave3:ip=127.0.0.1,port=7602,state=bg_transfer,offset=0,lag=0,type=main-channel\r\n" +
				"replicas_waiting_psync:0\r\nmaster_failover_state:no-failover\r\n" +
				"master_replid:f7541e270767e507a8543654091abc00c58dabbf\r\nmaster_replid2:0000000000000000000000000000000000000000\r\n" +
				"master_repl_offset:0\r\nsecond_repl_offset:-1\r\nrepl_backlog_active:1\r\nrepl_backlog_size:10485760\r\n" +
				"repl_backlog_first_byte_offset:1\r\nrepl_backlog_histlen:0\r\n",
			// Discovery visits each address once.
			want: replication{Role: RolePrimary, Replicas: []string{"127.0.0.1:7602", "127.0.0.1:7603", "127.0.0.1:7603", "127.0.0.1:7602"}},
		},
		{
			name: "Valkey 8.0 primary over IPv6, a replica waiting for its sync",
			give: "# Replication\r\nrole:master\r\nconnected_slaves:1\r\n" +
				"slave0:ip=::1,port=7951,state=wait_bgsave,offset=0,lag=0,type=replica\r\nreplicas_waiting_psync:0\r\n",
			want: replication{Role: RolePrimary, Replicas: []string{"[::1]:7951"}},
		},
		{
			name: "Valkey 8.0 replica in its full sync",
			give: "# Replication\r\nrole:slave\r\nmaster_host:127.0.0.1\r\nmaster_port:7611\r\nmaster_link_status:down\r\n" +
				"master_last_io_seconds_ago:-1\r\nmaster_sync_in_progress:1\r\nslave_read_repl_offset:1\r\nslave_repl_offset:1\r\n" +
				"replicas_repl_buffer_size:0\r\nreplicas_repl_buffer_peak:0\r\nmaster_sync_total_bytes:-1\r\nmaster_sync_read_bytes:0\r\n" +
				"master_sync_left_bytes:-1\r\nmaster_sync_perc:-0.00\r\nmaster_sync_last_io_seconds_ago:0\r\n" +
				"master_link_down_since_seconds:-1\r\nslave_priority:100\r\nslave_read_only:1\r\nreplica_announced:1\r\n" +
				"connected_slaves:0\r\nreplicas_waiting_psync:0\r\nmaster_failover_state:no-failover\r\n",
			want: replication{Role: RoleReplica, Primary: "127.0.0.1:7611"},
		},
		{
			name: "Redis 7.0 replica in its full sync",
			give: "# Replication\r\nrole:slave\r\nmaster_host:127.0.0.1\r\nmaster_port:7701\r\nmaster_link_status:down\r\n" +
				"master_last_io_seconds_ago:-1\r\nmaster_sync_in_progress:1\r\nslave_read_repl_offset:1\r\nslave_repl_offset:1\r\n" +
				"master_sync_total_bytes:-1\r\nmaster_sync_read_bytes:0\r\nmaster_sync_left_bytes:-1\r\nmaster_sync_perc:-0.00\r\n" +
				"master_sync_last_io_seconds_ago:0\r\nmaster_link_down_since_seconds:-1\r\nslave_priority:100\r\nslave_read_only:1\r\n" +
				"replica_announced:1\r\nconnected_slaves:0\r\nmaster_failover_state:no-failover\r\n",
			want: replication{Role: RoleReplica, Primary: "127.0.0.1:7701"},
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

// TestRemedy: a node the cluster flags fail that serves no slots (a failed-over primary, a
// replica) is told what to do with, by its ID; a primary that still owns slots, a pfail and
// a live node are not.
func TestRemedy(t *testing.T) {
	id := "65a04fb74cbcc54e577b51e317d402efdb3d1d59"
	fail := downFlags["fail"]
	for _, tt := range []struct {
		give Node
		want []string // nil: no remedy
	}{
		{Node{ID: id, Role: RolePrimary, Down: fail}, []string{
			"; it is a primary that owns no slots (most often one whose replica took over in a failover): restart it with its nodes.conf and it rejoins (as a replica of its old shard after a failover), or if it is gone for good remove it with CLUSTER FORGET " + id + " on every other node within 60s (valkey-cli --cluster call 127.0.0.1:7000 CLUSTER FORGET " + id + ")"}},
		{Node{ID: id, Role: RoleReplica, Primary: "127.0.0.1:7001", Down: fail}, []string{"; it is a replica: restart it with its nodes.conf and it rejoins, or ", "CLUSTER FORGET " + id}},
		{Node{ID: id, Role: RolePrimary, Slots: 5461, Down: fail}, nil},
		{Node{ID: id, Role: RolePrimary, Down: downFlags["fail?"]}, nil},
		{Node{ID: id, Role: RolePrimary, Down: downFlags["handshake"]}, nil},
		{Node{ID: id, Role: RolePrimary}, nil},
	} {
		got := remedy(tt.give, "127.0.0.1:7000")
		if (got == "") != (tt.want == nil) {
			t.Errorf("remedy(%+v) = %q, want %q", tt.give, got, tt.want)
		}
		for _, w := range tt.want {
			if !strings.Contains(got, w) {
				t.Errorf("remedy(%+v) = %q, want it to say %q", tt.give, got, w)
			}
		}
	}
}
