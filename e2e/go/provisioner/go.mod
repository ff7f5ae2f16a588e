module localvol.e2e/provisioner

go 1.26.0

require github.com/kubernetes-csi/external-provisioner/v5 v5.2.0
