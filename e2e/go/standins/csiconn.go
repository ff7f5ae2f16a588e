// Package standins holds what the two stand-in sidecars share: a gRPC connection to the CSI
// driver's socket and the flag set both accept.
package standins

import (
	"context"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Dial connects to a CSI endpoint given as a path or unix:// address, waiting for the driver.
func Dial(ctx context.Context, address string) (*grpc.ClientConn, error) {
	target := "unix://" + strings.TrimPrefix(address, "unix://")
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	conn.Connect()
	for {
		if conn.GetState().String() == "READY" {
			return conn, nil
		}
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		conn.WaitForStateChange(wctx, conn.GetState())
		cancel()
		if ctx.Err() != nil {
			conn.Close()
			return nil, ctx.Err()
		}
	}
}
