package deployer

import (
	"bufio"
	"cmp"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
)

// Role is a node's replication role.
type Role string

const (
	RolePrimary Role = "primary"
	RoleReplica Role = "replica"
)

// Node is one server of the target.
type Node struct {
	Addr    string // host:port the deployer dials
	ID      string // cluster node ID; "" for a standalone server
	Role    Role
	Primary string // for a replica, the address of the node it replicates from
	Slots   int    // hash slots a cluster primary owns (0 for a primary added before resharding)
}

// Topology is the target as discovered.
type Topology struct {
	Cluster bool
	Nodes   []Node   // primaries first, then replicas, each by address (host, then port as a number)
	Notes   []string // nodes left out and why, e.g. a cluster node flagged fail
}

// sortNodes puts primaries first, then replicas, each ordered by host and numeric port,
// so "127.0.0.1:7002" comes before "127.0.0.1:10001".
func sortNodes(nodes []Node) {
	slices.SortStableFunc(nodes, func(a, b Node) int {
		if a.Role != b.Role {
			if a.Role == RolePrimary {
				return -1
			}
			return 1
		}
		ah, ap := splitAddr(a.Addr)
		bh, bp := splitAddr(b.Addr)
		return cmp.Or(strings.Compare(ah, bh), cmp.Compare(ap, bp), strings.Compare(a.Addr, b.Addr))
	})
}

func splitAddr(addr string) (string, int) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr, 0
	}
	n, _ := strconv.Atoi(p)
	return h, n
}

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	Node
	primaryID string
	flags     []string
	myself    bool
}

// skipFlags mark nodes that are not serving: a failed node, one still in the handshake, or
// one whose address is unknown.
var skipFlags = []string{"fail", "handshake", "noaddr"}

func isSkipFlag(f string) bool { return slices.Contains(skipFlags, f) }

// parseClusterNodes reads CLUSTER NODES. A node's address comes from its
// "ip:port@cport[,hostname]" field; an empty ip (a node that has not learned its own
// address yet) is replaced by seedHost. Nodes flagged fail, handshake or noaddr are left
// out, each with a note saying so.
func parseClusterNodes(text, seedHost string) (nodes []Node, notes []string, err error) {
	var all []clusterNode
	byID := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20) // a node owning many slot ranges has a long line
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		// <id> <ip:port@cport[,hostname]> <flags> <primary> <ping> <pong> <epoch> <link> <slot>...
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, nil, fmt.Errorf("deployer: CLUSTER NODES line has %d fields, want at least 8: %q", len(f), line)
		}
		addr, err := nodeAddr(f[1], seedHost)
		if err != nil {
			return nil, nil, err
		}
		n := clusterNode{Node: Node{Addr: addr, ID: f[0]}, primaryID: f[3], flags: strings.Split(f[2], ",")}
		for _, fl := range n.flags {
			switch fl {
			case "master", "primary":
				n.Role = RolePrimary
			case "slave", "replica":
				n.Role = RoleReplica
			case "myself":
				n.myself = true
			}
		}
		if n.Role == "" && !slices.ContainsFunc(n.flags, isSkipFlag) {
			return nil, nil, fmt.Errorf("deployer: CLUSTER NODES: node %s (%s) is neither primary nor replica: flags %s", n.ID, addr, f[2])
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") { // a slot being migrated or imported, owned elsewhere
				continue
			}
			lo, hi, isRange := strings.Cut(r, "-")
			a, errA := strconv.Atoi(lo)
			b := a
			var errB error
			if isRange {
				b, errB = strconv.Atoi(hi)
			}
			if errA != nil || errB != nil || b < a {
				return nil, nil, fmt.Errorf("deployer: CLUSTER NODES: node %s: bad slot range %q", n.ID, r)
			}
			n.Slots += b - a + 1
		}
		byID[n.ID] = n.Addr
		all = append(all, n)
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("deployer: CLUSTER NODES: %w", err)
	}
	for _, n := range all {
		if fl := slices.IndexFunc(n.flags, isSkipFlag); fl >= 0 {
			role := string(n.Role)
			if role == "" {
				role = "node"
			}
			notes = append(notes, fmt.Sprintf("%s (%s, %s) left out: flagged %s", n.Addr, n.ID, role, n.flags[fl]))
			continue
		}
		if n.Role == RoleReplica {
			addr, ok := byID[n.primaryID]
			if !ok {
				notes = append(notes, fmt.Sprintf("%s (%s) replicates unknown node %s", n.Addr, n.ID, n.primaryID))
				addr = n.primaryID
			}
			n.Primary = addr
		}
		nodes = append(nodes, n.Node)
	}
	sortNodes(nodes)
	return nodes, notes, nil
}

// nodeAddr turns CLUSTER NODES' "ip:port@cport[,hostname]" into host:port.
func nodeAddr(field, seedHost string) (string, error) {
	hp, _, _ := strings.Cut(field, ",")
	hp, _, _ = strings.Cut(hp, "@")
	i := strings.LastIndexByte(hp, ':')
	if i < 0 {
		return "", fmt.Errorf("deployer: CLUSTER NODES: address %q has no port", field)
	}
	host, port := hp[:i], hp[i+1:]
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", fmt.Errorf("deployer: CLUSTER NODES: address %q has no valid port", field)
	}
	if host == "" {
		host = seedHost
	}
	return net.JoinHostPort(strings.Trim(host, "[]"), port), nil
}

// replication is what INFO replication says about a node's place in a standalone setup.
type replication struct {
	Role     Role
	Primary  string   // a replica's primary, host:port
	Replicas []string // a primary's (or chained replica's) replicas, host:port
}

// parseReplication reads INFO replication: role, a replica's master_host/master_port,
// and the slaveN:ip=...,port=... lines of the replicas attached to it.
func parseReplication(text string) (replication, error) {
	var r replication
	var host, port string
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok || strings.HasPrefix(k, "#") {
			continue
		}
		switch {
		case k == "role":
			switch v {
			case "master", "primary":
				r.Role = RolePrimary
			case "slave", "replica":
				r.Role = RoleReplica
			default:
				return replication{}, fmt.Errorf("deployer: INFO replication: unknown role %q", v)
			}
		case k == "master_host":
			host = v
		case k == "master_port":
			port = v
		case strings.HasPrefix(k, "slave") && isDigits(k[len("slave"):]):
			f := map[string]string{}
			for kv := range strings.SplitSeq(v, ",") {
				if a, b, ok := strings.Cut(kv, "="); ok {
					f[a] = b
				}
			}
			if f["ip"] == "" || f["port"] == "" {
				return replication{}, fmt.Errorf("deployer: INFO replication: %s has no ip or port: %q", k, v)
			}
			r.Replicas = append(r.Replicas, net.JoinHostPort(f["ip"], f["port"]))
		}
	}
	if r.Role == "" {
		return replication{}, fmt.Errorf("deployer: INFO replication has no role")
	}
	if r.Role == RoleReplica {
		if host == "" || port == "" {
			return replication{}, fmt.Errorf("deployer: INFO replication: a replica without master_host/master_port")
		}
		r.Primary = net.JoinHostPort(host, port)
	}
	return r, nil
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// infoField returns one field of INFO text.
func infoField(text, key string) string {
	for line := range strings.Lines(text) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == key {
			return v
		}
	}
	return ""
}

// keySlot is the cluster hash slot of key: CRC16 (XMODEM) of the key, or of its hash tag
// (the part between the first "{" and the next "}", when not empty), modulo 16384.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc % 16384)
}

// slotOwner returns, from CLUSTER NODES, the address of the primary serving slot; false
// when none does (the slot is unassigned, or its owner is flagged fail).
func slotOwner(text, seedHost string, slot int) (string, bool) {
	for line := range strings.Lines(text) {
		f := strings.Fields(line)
		if len(f) < 9 || slices.ContainsFunc(strings.Split(f[2], ","), isSkipFlag) {
			continue
		}
		for _, r := range f[8:] {
			lo, hi, isRange := strings.Cut(r, "-")
			if !isRange {
				hi = lo
			}
			a, errA := strconv.Atoi(lo)
			b, errB := strconv.Atoi(hi)
			if errA == nil && errB == nil && a <= slot && slot <= b {
				addr, err := nodeAddr(f[1], seedHost)
				return addr, err == nil
			}
		}
	}
	return "", false
}
