// Package client is the typed Go client of the ratelimit library: Allow, AllowN and Peek run
// its functions with FCALL (and FCALL_RO on replicas) through a valkey.Client the caller owns.
package client
