package serverurl

import (
	"strings"
	"testing"
	"time"
)

func TestParseURL(t *testing.T) {
	tests := []struct {
		give     string
		wantAddr string
		wantUser string
		wantPass string
		wantDB   int
		wantTLS  bool
		wantSNI  string
		wantErr  string
		hidden   []string // parts of the password no error may show
	}{
		{give: "redis://127.0.0.1:7001", wantAddr: "127.0.0.1:7001"},
		{give: "valkey://127.0.0.1:7001", wantAddr: "127.0.0.1:7001"},
		{give: "redis://localhost", wantAddr: "localhost:6379"},
		{give: "redis://deployer:s3cret@127.0.0.1:7001/2", wantAddr: "127.0.0.1:7001", wantUser: "deployer", wantPass: "s3cret", wantDB: 2},
		{give: "redis://:s3cret@127.0.0.1:7001", wantAddr: "127.0.0.1:7001", wantPass: "s3cret"},
		{give: "rediss://db.example:6380", wantAddr: "db.example:6380", wantTLS: true, wantSNI: "db.example"},
		{give: "valkeys://u:p@127.0.0.1:6380", wantAddr: "127.0.0.1:6380", wantUser: "u", wantPass: "p", wantTLS: true, wantSNI: "127.0.0.1"},
		{give: "http://127.0.0.1:7001", wantErr: `the scheme must be redis, valkey, rediss or valkeys, not "http"`},
		{give: "unix:///tmp/valkey.sock", wantErr: `the scheme must be redis, valkey, rediss or valkeys, not "unix"`},
		{give: "127.0.0.1:7001", wantErr: `URL "127.0.0.1:7001" has no scheme: write redis://HOST:PORT`},
		{give: "localhost:7442", wantErr: `URL "localhost:7442" has no scheme: write redis://HOST:PORT`},
		{give: "u:hunter2@127.0.0.1:7001", wantErr: "URL has no scheme: write redis://HOST:PORT"},
		{give: "localhost", wantErr: "has no scheme: write redis://HOST:PORT"},
		{give: "redis:127.0.0.1:7001", wantErr: "want redis://host:port"},
		{give: "redis://127.0.0.1:notaport", wantErr: "URL is not valid"},
		{give: "redis://127.0.0.1:99999", wantErr: `port "99999" is not a port`},
		{give: "redis://u:hunter2@127.0.0.1:7001/x", wantErr: "invalid database number"},
		{give: "redis://u:hunter2@127.0.0.1:7001/1/2", wantErr: "invalid URL path"},
		{give: "redis://u:hunter2@[::1", wantErr: "URL is not valid"},
		{give: "redis://127.0.0.1:6379/", wantAddr: "127.0.0.1:6379"},
		{give: "valkeys://user:pw@cache.internal:6380/2", wantAddr: "cache.internal:6380", wantUser: "user", wantPass: "pw", wantDB: 2, wantTLS: true, wantSNI: "cache.internal"},
		{give: "redis://u:hunter2@h:1?bogus=1", wantErr: `"redis://u:xxxxx@h:1?bogus=1": unknown parameter "bogus"`},
		{give: "redis://u:p@127.0.0.1:6379?dial_timeout=1s&db=3", wantAddr: "127.0.0.1:6379", wantUser: "u", wantPass: "p", wantDB: 3},
		{give: "redis://u:hunter2@127.0.0.1:6379?dial_timout=1s", wantErr: `unknown parameter "dial_timout"; there are db, dial_timeout,`},
		// Sentinel: the host is a Sentinel (valkey-go's master_set).
		{give: "redis://127.0.0.1:26379?master_set=mymaster", wantAddr: "127.0.0.1:26379"},
		{give: "redis://127.0.0.1:26379?master_set=", wantErr: "master_set= is empty"},
		// More nodes of a cluster to start from.
		{give: "redis://u:p@127.0.0.1:7001?addr=127.0.0.1:7002&addr=127.0.0.1:7003", wantAddr: "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003", wantUser: "u", wantPass: "p"},
		{give: "redis://127.0.0.1:7001?sentinel_password=hunter2", wantErr: "sentinel_password= is the Sentinels' credentials: it needs master_set="},
		{give: "redis://u:hunter2@h:1?master_set=m&sentinel_password=hunter2&bogus=1", wantErr: `unknown parameter "bogus"`},
		{give: "redis://u:p@127.0.0.1:6379/", wantAddr: "127.0.0.1:6379", wantUser: "u", wantPass: "p"},
		{give: "redis://u:s3cr%23et@127.0.0.1:6379", wantAddr: "127.0.0.1:6379", wantUser: "u", wantPass: "s3cr#et"},
		{give: "redis://u:s3cr%2Fet%3F@127.0.0.1:6379/1", wantAddr: "127.0.0.1:6379", wantUser: "u", wantPass: "s3cr/et?", wantDB: 1},
		// A password with a bare # / ? or % breaks the URL apart; the error must quote none
		// of it, whichever part of the URL the parser complains about.
		{give: "redis://u:s3cr#et@127.0.0.1:6379", wantErr: "must be URL-encoded", hidden: []string{"s3cr", "et@"}},
		{give: "redis://u:s3cr/et@127.0.0.1:6379", wantErr: "must be URL-encoded", hidden: []string{"s3cr", "et@"}},
		{give: "redis://u:s3cr?et@127.0.0.1:6379", wantErr: "must be URL-encoded", hidden: []string{"s3cr", "et@"}},
		{give: "redis://u:s3cr%zzet@127.0.0.1:6379", wantErr: "must be URL-encoded", hidden: []string{"s3cr", "zzet"}},
		// Digits before the # parse as a port: the URL is "valid", the password still cut.
		{give: "redis://u:4242#9191@127.0.0.1:6379", wantErr: "must be URL-encoded", hidden: []string{"4242", "9191"}},
		{give: "redis://u:4242/9191@127.0.0.1:6379", wantErr: "must be URL-encoded", hidden: []string{"4242", "9191"}},
		{give: "redis://u:4242?db=9191@127.0.0.1:6379", wantErr: "must be URL-encoded", hidden: []string{"4242", "9191"}},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			opt, err := Parse(tt.give)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				for _, h := range append(tt.hidden, "hunter2") {
					if strings.Contains(err.Error(), h) {
						t.Errorf("err %q shows the password (%q)", err, h)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(opt.InitAddress, ",") != tt.wantAddr {
				t.Errorf("addresses %v, want [%s]", opt.InitAddress, tt.wantAddr)
			}
			if opt.Username != tt.wantUser || opt.Password != tt.wantPass || opt.SelectDB != tt.wantDB {
				t.Errorf("user %q password %q db %d, want %q %q %d", opt.Username, opt.Password, opt.SelectDB, tt.wantUser, tt.wantPass, tt.wantDB)
			}
			if got := opt.TLSConfig != nil; got != tt.wantTLS {
				t.Fatalf("TLS %v, want %v", got, tt.wantTLS)
			}
			if tt.wantTLS && opt.TLSConfig.ServerName != tt.wantSNI {
				t.Errorf("TLS server name %q, want %q", opt.TLSConfig.ServerName, tt.wantSNI)
			}
			if !opt.DisableCache {
				t.Error("client-side caching left on")
			}
		})
	}
}

// A Sentinel's URL: every Sentinel, the set, the Sentinels' own credentials apart from the
// primary's, TLS for both, and no password in its redacted form.
func TestParseSentinel(t *testing.T) {
	raw := "rediss://app:pw@s1:26379?master_set=mymaster&addr=s2:26379&addr=s3:26379&sentinel_user=watch&sentinel_password=hunter2&dial_timeout=2s"
	opt, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(opt.InitAddress, ",") != "s1:26379,s2:26379,s3:26379" || opt.Sentinel.MasterSet != "mymaster" {
		t.Errorf("sentinels %v, set %q", opt.InitAddress, opt.Sentinel.MasterSet)
	}
	if opt.Username != "app" || opt.Password != "pw" || opt.Sentinel.Username != "watch" || opt.Sentinel.Password != "hunter2" {
		t.Errorf("credentials %q %q, Sentinel's %q %q", opt.Username, opt.Password, opt.Sentinel.Username, opt.Sentinel.Password)
	}
	if opt.TLSConfig == nil || opt.Sentinel.TLSConfig != opt.TLSConfig || opt.Sentinel.TopologyRefreshInterval <= 0 {
		t.Errorf("TLS %v, Sentinel's %v, refresh %v", opt.TLSConfig, opt.Sentinel.TLSConfig, opt.Sentinel.TopologyRefreshInterval)
	}
	// dial_timeout reaches the Sentinels too: valkey-go dials them with Sentinel.Dialer alone.
	if opt.Dialer.Timeout != 2*time.Second || opt.Sentinel.Dialer.Timeout != 2*time.Second {
		t.Errorf("dial timeout %v, Sentinels' %v; want 2s", opt.Dialer.Timeout, opt.Sentinel.Dialer.Timeout)
	}
	if r := Redact(raw); strings.Contains(r, "hunter2") || strings.Contains(r, ":pw@") {
		t.Errorf("Redact: %s", r)
	}
}

// BoundConnect bounds the dial of the nodes and of the Sentinels by d, and keeps a shorter
// dial_timeout the URL gave.
func TestBoundConnect(t *testing.T) {
	opt, err := Parse("redis://s1:26379?master_set=mymaster&dial_timeout=50ms")
	if err != nil {
		t.Fatal(err)
	}
	BoundConnect(&opt, 100*time.Millisecond)
	if opt.Dialer.Timeout != 50*time.Millisecond || opt.Sentinel.Dialer.Timeout != 50*time.Millisecond {
		t.Errorf("the URL's shorter timeout: %v, Sentinels' %v", opt.Dialer.Timeout, opt.Sentinel.Dialer.Timeout)
	}
	opt, err = Parse("redis://s1:26379?master_set=mymaster")
	if err != nil {
		t.Fatal(err)
	}
	BoundConnect(&opt, 100*time.Millisecond)
	if opt.Dialer.Timeout != 100*time.Millisecond || opt.Sentinel.Dialer.Timeout != 100*time.Millisecond {
		t.Errorf("bounded: %v, Sentinels' %v; want 100ms", opt.Dialer.Timeout, opt.Sentinel.Dialer.Timeout)
	}
}
