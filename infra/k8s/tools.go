//go:build tools

// Package tools pins the Kubernetes control-plane binaries the sandbox builds (see build.sh).
// The project's own code is Python; this module exists only to build kube-apiserver and
// kube-controller-manager from k8s.io/kubernetes, whose own replace directives stop a plain
// `go install`: go.mod here replaces every k8s.io staging module with its v0.x release.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
