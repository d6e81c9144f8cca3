package main

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func newReconciler(t *testing.T, objects ...client.Object) (*MirrorReconciler, *[]reconcileLine) {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	var lines []reconcileLine
	r := &MirrorReconciler{
		Client: fake.NewClientBuilder().WithScheme(scheme).WithObjects(objects...).Build(),
		Scheme: scheme,
		Report: func(l reconcileLine) { lines = append(lines, l) },
	}
	return r, &lines
}

func source(name string, labelled bool, data map[string]string) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
		Data:       data,
	}
	if labelled {
		cm.Labels = map[string]string{MirrorLabel: "true"}
	}
	return cm
}

func reconcile(t *testing.T, r *MirrorReconciler, name string) {
	t.Helper()
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}}
	if _, err := r.Reconcile(context.Background(), req); err != nil {
		t.Fatalf("reconcile %s: %v", name, err)
	}
}

func getMirror(t *testing.T, r *MirrorReconciler, name string) *corev1.ConfigMap {
	t.Helper()
	var mirror corev1.ConfigMap
	err := r.Client.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: name + MirrorSuffix}, &mirror)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return &mirror
}

func TestMirrorCreatedThenUpdatedThenUnchanged(t *testing.T) {
	r, lines := newReconciler(t, source("a", true, map[string]string{"k": "1"}))
	reconcile(t, r, "a")
	mirror := getMirror(t, r, "a")
	if mirror == nil || mirror.Data["k"] != "1" || mirror.Labels[MirrorOfLabel] != "a" {
		t.Fatalf("mirror after create: %+v", mirror)
	}
	owner := metav1.GetControllerOf(mirror)
	if owner == nil || owner.Kind != "ConfigMap" || owner.Name != "a" || owner.UID != "uid-a" {
		t.Fatalf("controller reference: %+v", owner)
	}

	var src corev1.ConfigMap
	if err := r.Client.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "a"}, &src); err != nil {
		t.Fatal(err)
	}
	src.Data = map[string]string{"k": "2"}
	if err := r.Client.Update(context.Background(), &src); err != nil {
		t.Fatal(err)
	}
	reconcile(t, r, "a")
	if mirror := getMirror(t, r, "a"); mirror.Data["k"] != "2" {
		t.Fatalf("mirror after update: %+v", mirror.Data)
	}
	reconcile(t, r, "a")

	var results []string
	for _, l := range *lines {
		results = append(results, l.Result)
	}
	if len(results) != 3 || results[0] != "created" || results[1] != "updated" || results[2] != "unchanged" {
		t.Fatalf("results: %v", results)
	}
}

func TestUnlabelledAndMissingSourcesGetNoMirror(t *testing.T) {
	r, lines := newReconciler(t, source("plain", false, map[string]string{"k": "1"}))
	reconcile(t, r, "plain")
	reconcile(t, r, "absent")
	if getMirror(t, r, "plain") != nil || getMirror(t, r, "absent") != nil {
		t.Fatal("a mirror was created for an unlabelled or missing source")
	}
	if got := (*lines)[0].Result + "," + (*lines)[1].Result; got != "ignored,gone" {
		t.Fatalf("results: %s", got)
	}
}
