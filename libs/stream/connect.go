package stream

import (
	"crypto/tls"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Connect opens the connection every reader and writer of the stream holds:
// it retries the first connect and reconnects forever (a NATS restart is an
// outage to ride out, not an exit), with TLS when tlsConfig is set and the
// service's own credentials when user is (called on every reconnect, so a
// rotated password is picked up). name identifies the process in NATS's
// connection list.
func Connect(url, name string, tlsConfig *tls.Config, user func() (string, string)) (*nats.Conn, jetstream.JetStream, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(200 * time.Millisecond),
	}
	if user != nil {
		opts = append(opts, nats.UserInfoHandler(user))
	}
	if tlsConfig != nil {
		opts = append(opts, nats.Secure(tlsConfig))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("nats: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}
