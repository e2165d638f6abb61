package deployer

import (
	"errors"
	"strings"
	"testing"
)

func TestPartialError(t *testing.T) {
	oom := errors.New("FUNCTION LOAD: OOM command not allowed\nwhen used memory > 'maxmemory'")
	n1, n2, n3 := Node{Addr: "127.0.0.1:7001"}, Node{Addr: "127.0.0.1:7002"}, Node{Addr: "127.0.0.1:7003"}
	tests := []struct {
		name string
		give *PartialError
		want string
	}{
		{
			name: "a primary refused, the others restored",
			give: &PartialError{Err: &NodeError{Addr: n3.Addr, Err: oom}, Report: Report{To: "1.1.0", RolledBack: true, Nodes: []NodeResult{
				{Node: n1, Outcome: OutcomeRestored},
				{Node: n2, Outcome: OutcomeRestored},
				{Node: n3, Outcome: OutcomeFailed, Err: oom},
			}}},
			want: "deployer: deploy of 1.1.0 rolled back: 127.0.0.1:7003 failed: " +
				"FUNCTION LOAD: OOM command not allowed when used memory > 'maxmemory'",
		},
		{
			name: "two primaries refused",
			give: &PartialError{Err: &NodeError{Addr: n3.Addr, Err: oom}, Report: Report{To: "1.1.0", RolledBack: true, Nodes: []NodeResult{
				{Node: n1, Outcome: OutcomeFailed, Err: oom},
				{Node: n2, Outcome: OutcomeRestored},
				{Node: n3, Outcome: OutcomeFailed, Err: oom},
			}}},
			want: "deployer: deploy of 1.1.0 rolled back: 127.0.0.1:7003 failed: " +
				"FUNCTION LOAD: OOM command not allowed when used memory > 'maxmemory'; also failed: 127.0.0.1:7001",
		},
		{
			name: "a restore failed: not rolled back, and the nodes NOT restored named",
			give: &PartialError{Err: &NodeError{Addr: n3.Addr, Err: oom}, Report: Report{To: "1.1.0", RolledBack: false, Nodes: []NodeResult{
				{Node: n1, Outcome: OutcomeRestored},
				{Node: n2, Outcome: OutcomeRestoreFailed, Err: errors.New("restore: i/o timeout")},
				{Node: n3, Outcome: OutcomeFailed, Err: oom},
				{Node: Node{Addr: "127.0.0.1:7004"}, Outcome: OutcomeRestoreFailed},
			}}},
			want: "deployer: deploy of 1.1.0 incomplete: 127.0.0.1:7003 failed: " +
				"FUNCTION LOAD: OOM command not allowed when used memory > 'maxmemory'; NOT restored: 127.0.0.1:7002, 127.0.0.1:7004",
		},
		{
			name: "a replica lagged while another node failed its verification: both named",
			give: &PartialError{Err: &NodeError{Addr: n3.Addr, Err: errors.New("verify: has other code after 10s")}, Report: Report{To: "1.1.0", RolledBack: true, Nodes: []NodeResult{
				{Node: n1, Outcome: OutcomeRestored},
				{Node: n2, Outcome: OutcomeLagging, Err: errors.New("runs 1.0.0, not 1.1.0")},
				{Node: n3, Outcome: OutcomeFailed, Err: errors.New("verify: has other code after 10s")},
			}}},
			want: "deployer: deploy of 1.1.0 rolled back: 127.0.0.1:7003 failed: verify: has other code after 10s; lagging replicas: 127.0.0.1:7002",
		},
		{
			name: "the lock was lost",
			give: &PartialError{Err: ErrLockLost, Report: Report{To: "1.1.0", RolledBack: true, Nodes: []NodeResult{
				{Node: n1, Outcome: OutcomeRestored},
			}}},
			want: "deployer: deploy of 1.1.0 rolled back: the deploy lock was lost",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.give.Error()
			if got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
			if !errors.Is(tt.give, tt.give.Err) {
				t.Error("PartialError does not unwrap to its cause")
			}
			var ne *NodeError
			if errors.As(tt.give.Err, &ne) && strings.Count(got, ne.Addr) != 1 {
				t.Errorf("%q names %s more than once", got, ne.Addr)
			}
		})
	}
}

func TestReportNotRestored(t *testing.T) {
	rep := Report{Nodes: []NodeResult{
		{Node: Node{Addr: "127.0.0.1:7001"}, Outcome: OutcomeRestored},
		{Node: Node{Addr: "127.0.0.1:7002"}, Outcome: OutcomeRestoreFailed},
		{Node: Node{Addr: "127.0.0.1:7003"}, Outcome: OutcomeFailed},
	}}
	got := rep.NotRestored()
	if len(got) != 1 || got[0].Node.Addr != "127.0.0.1:7002" {
		t.Errorf("NotRestored() = %v, want 127.0.0.1:7002 only", got)
	}
}
