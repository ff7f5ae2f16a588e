// Command csi-version-shim serves a CSI driver's socket in front of the driver's own,
// answering Identity.GetPluginInfo itself and passing every other call through unchanged
// (bytes in, bytes out, with the driver's status). The e2e benchmark puts it before the
// reference driver: ../shared/tools' hostpathplugin was built without `-X main.version`, so
// it answers GetPluginInfo with "Driver is missing version" and kubelet never registers it;
// its source is not served by the Go module proxy, so it cannot be built again here.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"localvol.e2e/standins"
)

// raw passes messages through as the bytes they are.
type raw struct{}

func (raw) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (raw) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (raw) Name() string { return "proto" }

func main() {
	listen := flag.String("listen", "", "socket path to serve")
	backend := flag.String("backend", "", "the driver's own socket path")
	name := flag.String("name", "", "plugin name GetPluginInfo answers")
	version := flag.String("version", "", "vendor version GetPluginInfo answers")
	flag.Parse()
	if *listen == "" || *backend == "" || *name == "" || *version == "" {
		log.Fatal("csi-version-shim: --listen, --backend, --name and --version are required")
	}
	conn, err := standins.Dial(context.Background(), *backend)
	if err != nil {
		log.Fatalf("csi-version-shim: %s: %v", *backend, err)
	}
	info, err := proto.Marshal(&csi.GetPluginInfoResponse{Name: *name, VendorVersion: *version})
	if err != nil {
		log.Fatal(err)
	}
	_ = os.Remove(*listen)
	lis, err := net.Listen("unix", *listen)
	if err != nil {
		log.Fatalf("csi-version-shim: %v", err)
	}
	pass := func(_ any, stream grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(stream)
		var req []byte
		if err := stream.RecvMsg(&req); err != nil {
			return err
		}
		if method == "/csi.v1.Identity/GetPluginInfo" {
			return stream.SendMsg(&info)
		}
		var resp []byte
		if err := conn.Invoke(stream.Context(), method, &req, &resp, grpc.ForceCodec(raw{})); err != nil {
			return err
		}
		return stream.SendMsg(&resp)
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(raw{}), grpc.UnknownServiceHandler(pass))
	log.Printf("csi-version-shim: %s -> %s", *listen, *backend)
	log.Fatal(srv.Serve(lis))
}
