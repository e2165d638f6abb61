package client

import (
	"strconv"
	"testing"
	"time"
)

// The cache holds about maxKeys keys however many are denied, and forgets expired denials.
func TestDenialsBounded(t *testing.T) {
	const maxKeys = 640
	d := newDenials(maxKeys)
	now := int64(time.Hour)
	res := Result{Limit: 5, RetryAfter: time.Second, ResetAfter: 2 * time.Second}
	for i := range 100_000 {
		sk := []byte("rl:{" + strconv.Itoa(i) + "}:token_bucket\x005 1 1000 0 0 ")
		d.put(sk, len(sk)-12, 1, now, now, res)
	}
	if n := d.len(); n > maxKeys {
		t.Fatalf("%d keys held, want at most %d", n, maxKeys)
	}
	// Four denials per key at most: other costs replace the one that ends first.
	sk := []byte("rl:{k}:token_bucket\x005 1 1000 0 0 ")
	n := len(sk) - 12
	for cost := range int64(10) {
		d.put(sk, n, cost+1, now+cost, now, res)
	}
	if got := len(d.shard(sk[:n]).m[string(sk[:n])]); got != denialsPerKey {
		t.Fatalf("%d denials held for one key, want %d", got, denialsPerKey)
	}
	if _, ok := d.get(sk, n, 10, now+int64(time.Millisecond)); !ok {
		t.Fatal("the latest denial was evicted")
	}
	if _, ok := d.get(sk, n, 1, now); ok {
		t.Fatal("the denial that ends first is still held")
	}
	// Counting down, then gone once RetryAfter has passed.
	r, ok := d.get(sk, n, 10, now+9+int64(400*time.Millisecond))
	if !ok || r.Source != FromDenialCache || r.Allowed || r.RetryAfter != 600*time.Millisecond || r.ResetAfter != 1600*time.Millisecond {
		t.Fatalf("400ms after: %+v, %v", r, ok)
	}
	if _, ok := d.get(sk, n, 10, now+9+int64(time.Second)); ok {
		t.Fatal("a denial answered after its RetryAfter")
	}
	d.drop(sk[:n])
	if _, ok := d.get(sk, n, 10, now+9); ok {
		t.Fatal("a dropped key's denial answered")
	}
	// A denial that can never be admitted, or whose RetryAfter has passed already, is not kept.
	never := res
	never.RetryAfter = Never
	d.put([]byte("x\x00"), 1, 1, now, now, never)
	d.put([]byte("y\x00"), 1, 1, now-int64(2*time.Second), now, res)
	if _, ok := d.get([]byte("x\x00"), 1, 1, now); ok {
		t.Fatal("a denial with RetryAfter Never was kept")
	}
	if _, ok := d.get([]byte("y\x00"), 1, 1, now); ok {
		t.Fatal("an expired denial was kept")
	}
}
