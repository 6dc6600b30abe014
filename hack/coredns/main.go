// Command coredns is CoreDNS with only the plugins localkube's test node needs, selected at
// compile time the way CoreDNS documents it (its own main package pulls in every plugin and
// every cloud SDK). hack/kube-binaries.sh --node builds it against the pinned CoreDNS module.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The order in which plugins see a query (upstream's plugin.cfg order).
var directives = []string{"bind", "ready", "health", "errors", "log", "cache", "kubernetes"}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }
