//go:build tools

// Package tools pins the Kubernetes control-plane binaries the sandbox builds (see build.sh):
// etcd (the version kube-apiserver itself requires; Debian's 3.4.23 lacks watch progress
// requests, which makes every informer fall back to slow relists), kube-apiserver,
// kube-controller-manager and kube-scheduler (places the pods of the sandbox's Deployments).
// The project's own code is Python; this module exists only to build kube-apiserver and
// kube-controller-manager from k8s.io/kubernetes, whose own replace directives stop a plain
// `go install`: go.mod here replaces every k8s.io staging module with its v0.x release.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
