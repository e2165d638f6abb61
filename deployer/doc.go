// Package deployer discovers the nodes of a Valkey or Redis deployment, inspects which
// release of the ratelimit library each one runs, plans a deploy as data, and applies it:
// FUNCTION LOAD REPLACE on every primary, verify every node, restore on any failure.
//
// The flow is Discover -> Target.Inspect -> NewPlan -> Target.Apply. NewPlan is a pure
// function, so what a deploy would do can be printed, diffed or tested without a server.
//
// # Lock
//
// Two deploys against the same target must not interleave, so Apply holds a lock for the
// whole run: the key LockKey ("rlfn:deploy:lock"), written with SET NX PX on the primary of
// a standalone target, or on whichever primary owns the key's slot in a cluster. Its value
// names the holder (user, host and process) then "|" and a random token; a second deploy
// gets ErrLocked with that holder and the lease left. While Apply runs, a goroutine renews
// the lease every third of Options.LockLease (compare-and-PEXPIRE, each given a third of
// the lease to answer); Apply releases it with compare-and-delete, both as small EVAL
// scripts. If the deployer dies, the lease expires. A release that fails does not fail a
// deploy (the lease expires by itself): it is in Report.Warnings. Lock errors name the key
// and the node holding it.
//
// A lock that is lost while Apply runs (a renewal finds another holder, or no renewal
// got through for a whole lease) stops the deploy, and Apply restores what it changed.
// That restore runs without the lock: it may race the deploy that now holds it, and
// overwrite what that one just loaded. The lease is there to make this unlikely (keep it
// well above the time a node takes to answer), not impossible; the Report says what was
// restored, and a status afterwards shows what each node runs.
//
// # Permissions
//
// A deploy-only ACL user needs exactly ACLRules (with LockKey, or Options.LockKey):
//
//	ACL SETUSER deployer on >password resetkeys ~rlfn:deploy:lock resetchannels -@all
//	    +info +cluster|nodes
//	    +function|list +function|load +function|delete +fcall_ro
//	    +set +get +pttl +eval +pexpire +del
//
// info and cluster|nodes: discovery, and finding the lock key's slot owner (HELLO and AUTH
// need no rule); function|list: inspect and verify;
// function|load and function|delete: deploy and restore; fcall_ro: verify rl_version;
// set, get, pttl, eval, and pexpire and del (which the renew and release scripts call)
// on the lock key only: the lock. No other key is readable. ACL
// users are per node: create the user on every node, replicas included. Inspect also asks
// FUNCTION STATS, to tell a server built without the Lua engine; these rules refuse it, which
// Inspect takes as "not told" (such a server then fails the deploy's load, and is restored).
// Coverage asks CONFIG GET cluster-require-full-coverage, which they refuse too (CONFIG GET
// reads every setting, passwords included): it then warns that the setting could not be read.
package deployer
