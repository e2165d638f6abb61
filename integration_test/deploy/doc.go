// Package deploy tests the deployer against real servers the harness starts for it
// (a Valkey cluster, Valkey and Redis with replicas, TLS, ACL users), apart from the
// shared environment of integration_test so that deploys never disturb other tests.
package deploy
