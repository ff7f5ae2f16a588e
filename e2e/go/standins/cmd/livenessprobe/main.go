// A stand-in for the livenessprobe sidecar, whose module the Go proxy here does not serve:
// /healthz calls the driver's Probe within --probe-timeout and answers 200 when it says ready
// (or leaves readiness unset), 500 otherwise. It accepts the flags the chart passes
// (--csi-address, --http-endpoint, --probe-timeout) and ignores klog's -v.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"

	"localvol.e2e/standins"
)

func main() {
	csiAddress := flag.String("csi-address", "/run/csi/socket", "the driver's socket in this container")
	httpEndpoint := flag.String("http-endpoint", ":9808", "address of /healthz")
	timeout := flag.Duration("probe-timeout", time.Second, "how long a Probe may take")
	flag.Int("v", 0, "ignored (klog verbosity upstream)")
	flag.Parse()

	conn, err := standins.Dial(context.Background(), *csiAddress)
	if err != nil {
		log.Fatalf("connecting to %s: %v", *csiAddress, err)
	}
	identity := csi.NewIdentityClient(conn)
	http.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), *timeout)
		defer cancel()
		rsp, err := identity.Probe(ctx, &csi.ProbeRequest{})
		if err == nil && rsp.GetReady() != nil && !rsp.GetReady().GetValue() {
			err = fmt.Errorf("the driver answered Probe with ready=false")
		}
		if err != nil {
			log.Printf("health check failed: %v", err)
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Write([]byte("ok"))
	})
	log.Printf("serving /healthz on %s for %s", *httpEndpoint, *csiAddress)
	log.Fatal(http.ListenAndServe(*httpEndpoint, nil))
}
