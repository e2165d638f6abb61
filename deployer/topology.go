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
	// Down says why the cluster holds this node not to be serving ("flagged fail" and the
	// like, from CLUSTER NODES): it is known, but unreachable, and never dialled. "" for a
	// node that is not known to be down (it may still not answer).
	Down string
}

// Topology is the target as discovered: every node the server knows of, those it holds to
// be down included (Node.Down), so that none is left out of a status, plan or report.
type Topology struct {
	Cluster bool
	Nodes   []Node // primaries first, then replicas, each by address (host, then port as a number)

	slots []slotRange // a cluster's slot owners, from the same CLUSTER NODES as Nodes
}

// slotRange is a range of hash slots served by one primary.
type slotRange struct {
	lo, hi int
	addr   string
}

// KeyOwner returns the primary of a cluster serving key's hash slot, as discovered; false
// when no node serves it (or the target is not a cluster).
func (t Topology) KeyOwner(key string) (Node, bool) {
	if !t.Cluster {
		return Node{}, false
	}
	return t.owner(keySlot(key))
}

// owner returns the primary serving slot; false when no node serves it.
func (t Topology) owner(slot int) (Node, bool) {
	for _, r := range t.slots {
		if r.lo <= slot && slot <= r.hi {
			if i := slices.IndexFunc(t.Nodes, func(n Node) bool { return n.Addr == r.addr }); i >= 0 {
				return t.Nodes[i], true
			}
		}
	}
	return Node{}, false
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

// downFlags mark nodes that are not serving: failed (or suspected so by this node: "fail?"),
// still in the handshake, or whose address is unknown.
var downFlags = map[string]string{
	"fail":      "flagged fail by the cluster",
	"fail?":     "flagged pfail (not answering the node asked)",
	"pfail":     "flagged pfail (not answering the node asked)",
	"handshake": "still in the cluster handshake",
	"noaddr":    "flagged noaddr: the cluster knows no address for it",
}

// injected is what a CLUSTER NODES reply that lists a node twice, a slot's owner twice, a
// line cut short, or a node ID that is not one most likely holds: lines a node wrote through
// its announced address, which is printed as is, line breaks included (the same holds for a
// replica's address in INFO replication). Such a reply is refused: its lines would add nodes
// to dial with the deployment's credentials and to deploy to.
//
// The node ID is what makes the refusal sure: every server prints at most 45 bytes of an
// announced address (Valkey 8.0 and Redis 7.0 keep it in 46 with the NUL, in gossip and in
// the node's own line), too few to finish the line it starts and to write a whole line of a
// node with a real ID (40 hex digits) after it. Without that check, "1:1@2 slave c 0 0 1
// c\nZ 6.6.6.6" made rlfn dial 6.6.6.6 as a replica.
const injected = "a node announces an address holding a line break (cluster-announce-ip)?"

// injectedReplica is what an INFO replication reply that holds a line twice, or a replica line
// past connected_slaves, most likely holds (see parseReplication).
const injectedReplica = "a replica announces an address holding a line break (replica-announce-ip)?"

// isNodeID reports whether s is a cluster node ID as servers make them: 40 hex digits.
func isNodeID(s string) bool {
	if len(s) != 40 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// parseClusterNodes reads CLUSTER NODES into a Topology. A node's address comes from its
// "ip:port@cport[,hostname]" field; an empty ip (a node that has not learned its own
// address yet) is replaced by seedHost. Every node is listed: one flagged fail, pfail,
// handshake or noaddr has Down set, and a replica of a node missing from the view has the
// missing node's ID as Primary (a plan says it is not found).
func parseClusterNodes(text, seedHost string) (Topology, error) {
	topo := Topology{Cluster: true}
	var primaryIDs []string
	byID := map[string]string{}
	var owned [16384]bool
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
			return Topology{}, fmt.Errorf("deployer: CLUSTER NODES line has %d fields, want at least 8: %q (%s)", len(f), line, injected)
		}
		if !isNodeID(f[0]) {
			return Topology{}, fmt.Errorf("deployer: CLUSTER NODES line starts with %q, not a node ID: %q (%s)", f[0], line, injected)
		}
		if f[3] != "-" && !isNodeID(f[3]) {
			return Topology{}, fmt.Errorf("deployer: CLUSTER NODES: node %s replicates %q, not a node ID: %q (%s)", f[0], f[3], line, injected)
		}
		addr, err := nodeAddr(f[1], seedHost)
		if err != nil {
			return Topology{}, err
		}
		if _, dup := byID[f[0]]; dup {
			return Topology{}, fmt.Errorf("deployer: CLUSTER NODES lists node %s twice: %s", f[0], injected)
		}
		n := Node{Addr: addr, ID: f[0]}
		for _, fl := range strings.Split(f[2], ",") {
			switch fl {
			case "master", "primary":
				n.Role = RolePrimary
			case "slave", "replica":
				n.Role = RoleReplica
			}
			if why, ok := downFlags[fl]; ok && n.Down == "" {
				n.Down = why
			}
		}
		if n.Role == "" {
			if n.Down == "" {
				return Topology{}, fmt.Errorf("deployer: CLUSTER NODES: node %s (%s) is neither primary nor replica: flags %s", n.ID, addr, f[2])
			}
			// A node in the handshake has no role yet: it joins as a primary.
			n.Role = RolePrimary
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
			if errA != nil || errB != nil || b < a || b >= len(owned) {
				return Topology{}, fmt.Errorf("deployer: CLUSTER NODES: node %s: bad slot range %q", n.ID, r)
			}
			for slot := a; slot <= b; slot++ {
				if owned[slot] {
					// One node's view has one owner per slot.
					return Topology{}, fmt.Errorf("deployer: CLUSTER NODES gives slot %d two owners: %s", slot, injected)
				}
				owned[slot] = true
			}
			n.Slots += b - a + 1
			topo.slots = append(topo.slots, slotRange{lo: a, hi: b, addr: addr})
		}
		byID[n.ID] = n.Addr
		topo.Nodes = append(topo.Nodes, n)
		primaryIDs = append(primaryIDs, f[3])
	}
	if err := sc.Err(); err != nil {
		return Topology{}, fmt.Errorf("deployer: CLUSTER NODES: %w", err)
	}
	for i := range topo.Nodes {
		if n := &topo.Nodes[i]; n.Role == RoleReplica {
			n.Primary = primaryIDs[i]
			if addr, ok := byID[primaryIDs[i]]; ok {
				n.Primary = addr
			}
		}
	}
	sortNodes(topo.Nodes)
	return topo, nil
}

// remedy says what to do about a node the cluster flags fail and that serves no slots,
// after its Down; "" for any other node. Such a node stays in every node's view until it
// is restarted or forgotten, and until then status cannot read it and every deploy is
// refused: most often a primary whose replica took its slots over in a failover. Restarted
// with its nodes.conf, it rejoins (a failed-over primary as a replica of its old shard);
// gone for good, every node must forget it within 60 seconds, or those that still know it
// teach it back to the others by gossip. valkey-cli --cluster call sends the FORGET to every
// node it reaches (its del-node refuses a node it cannot reach); the node's own replicas
// refuse to forget their primary, and a failed-over one has none. via is a node to send it
// from (the URL's).
func remedy(n Node, via string) string {
	if n.Down != downFlags["fail"] || (n.Role == RolePrimary && n.Slots > 0) {
		return "" // pfail may pass; a primary with slots is an outage its replica may end
	}
	what := "a replica"
	if n.Role == RolePrimary {
		what = "a primary that owns no slots (most often one whose replica took over in a failover)"
	}
	return fmt.Sprintf("; it is %s: restart it with its nodes.conf and it rejoins%s, or if it is gone for good remove it with "+
		"CLUSTER FORGET %s on every other node within 60s (valkey-cli --cluster call %s CLUSTER FORGET %s)",
		what, map[Role]string{RolePrimary: " (as a replica of its old shard after a failover)"}[n.Role], n.ID, via, n.ID)
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
//
// A replica announces its own address (replica-announce-ip), and its primary prints it as
// is, line breaks included: a line INFO holds twice, or a replica line past
// connected_slaves, was written by such an address, which would otherwise turn the primary
// into a replica of a server of its choosing (role, master_host), or add replicas to dial
// with the deployment's credentials. Such a reply is an error, never read.
func parseReplication(text string) (replication, error) {
	var r replication
	var host, port string
	seen := map[string]bool{}
	replicas := -1 // connected_slaves, when told
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok || strings.HasPrefix(k, "#") {
			continue
		}
		if seen[k] {
			return replication{}, fmt.Errorf("deployer: INFO replication holds %s twice: %s", k, injectedReplica)
		}
		seen[k] = true
		switch {
		case k == "connected_slaves":
			if n, err := strconv.Atoi(v); err == nil {
				replicas = n
			}
		case strings.HasPrefix(k, "slave") && isDigits(k[len("slave"):]) && replicas >= 0:
			if n, _ := strconv.Atoi(k[len("slave"):]); n >= replicas {
				return replication{}, fmt.Errorf("deployer: INFO replication lists %s with connected_slaves:%d: %s", k, replicas, injectedReplica)
			}
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
