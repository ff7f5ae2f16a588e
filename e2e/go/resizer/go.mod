module localvol.e2e/resizer

go 1.26.0

require github.com/kubernetes-csi/external-resizer v1.13.1
