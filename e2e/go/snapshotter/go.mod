module localvol.e2e/snapshotter

go 1.26.0

require (
	github.com/kubernetes-csi/external-snapshotter/client/v8 v8.2.0
	github.com/kubernetes-csi/external-snapshotter/v8 v8.2.0
)
