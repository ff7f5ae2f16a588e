// A stand-in for node-driver-registrar, whose module the Go proxy here does not serve. It does
// what kubelet needs of it: asks the driver its name (GetPluginInfo), serves kubelet's plugin
// registration API (pluginregistration/v1) on <registration dir>/<driver>-reg.sock, answering
// GetInfo with the driver socket's path on the host, and exits when kubelet reports that the
// registration failed. /healthz answers 200 while the registration socket exists. It accepts
// the flags the chart passes (--csi-address, --kubelet-registration-path, --http-endpoint)
// and ignores klog's -v.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	reg "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"localvol.e2e/standins"
)

type server struct {
	reg.UnimplementedRegistrationServer
	name, endpoint string
}

func (s *server) GetInfo(context.Context, *reg.InfoRequest) (*reg.PluginInfo, error) {
	return &reg.PluginInfo{Type: reg.CSIPlugin, Name: s.name, Endpoint: s.endpoint, SupportedVersions: []string{"1.0.0"}}, nil
}

func (s *server) NotifyRegistrationStatus(_ context.Context, st *reg.RegistrationStatus) (*reg.RegistrationStatusResponse, error) {
	if !st.PluginRegistered {
		log.Fatalf("kubelet did not register %s: %s", s.name, st.Error)
	}
	log.Printf("kubelet registered %s", s.name)
	return &reg.RegistrationStatusResponse{}, nil
}

func main() {
	csiAddress := flag.String("csi-address", "/csi/csi.sock", "the driver's socket in this container")
	endpoint := flag.String("kubelet-registration-path", "", "the driver's socket on the host, for kubelet")
	regDir := flag.String("plugin-registration-path", "/registration", "kubelet's plugin registration dir in this container")
	httpEndpoint := flag.String("http-endpoint", "", "address of /healthz (empty: none)")
	flag.Int("v", 0, "ignored (klog verbosity upstream)")
	flag.Parse()
	if *endpoint == "" {
		log.Fatal("--kubelet-registration-path is required")
	}

	ctx := context.Background()
	conn, err := standins.Dial(ctx, *csiAddress)
	if err != nil {
		log.Fatalf("connecting to %s: %v", *csiAddress, err)
	}
	info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	conn.Close()
	if err != nil {
		log.Fatalf("GetPluginInfo: %v", err)
	}

	sock := filepath.Join(*regDir, info.GetName()+"-reg.sock")
	if err := os.Remove(sock); err != nil && !os.IsNotExist(err) {
		log.Fatalf("removing the old %s: %v", sock, err)
	}
	lis, err := net.Listen("unix", sock)
	if err != nil {
		log.Fatalf("listening on %s: %v", sock, err)
	}
	// The socket is removed on exit only while it is still this one: a pod
	// being replaced shuts down while its successor's registrar has bound the
	// same path, and removing that (as Go's listener does on Close) made
	// kubelet deregister the driver from the new pod (found by e2e story m).
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	var ours syscall.Stat_t
	if err := syscall.Lstat(sock, &ours); err != nil {
		log.Fatalf("stat %s: %v", sock, err)
	}
	g := grpc.NewServer()
	reg.RegisterRegistrationServer(g, &server{name: info.GetName(), endpoint: *endpoint})

	if *httpEndpoint != "" {
		http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
			if _, err := os.Stat(sock); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.Write([]byte("ok"))
		})
		go func() { log.Fatal(http.ListenAndServe(*httpEndpoint, nil)) }()
	}
	go func() {
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
		<-c
		removeIfOurs(sock, ours)
		g.Stop()
		os.Exit(0)
	}()
	log.Printf("serving registration of %s (%s) on %s", info.GetName(), *endpoint, sock)
	log.Fatal(g.Serve(lis))
}

// removeIfOurs removes path if it is still the socket ours describes.
func removeIfOurs(path string, ours syscall.Stat_t) {
	var now syscall.Stat_t
	if err := syscall.Lstat(path, &now); err != nil || now.Dev != ours.Dev || now.Ino != ours.Ino {
		log.Printf("%s is not this registrar's any more: left in place", path)
		return
	}
	if err := os.Remove(path); err != nil {
		log.Printf("removing %s: %v", path, err)
	}
}
