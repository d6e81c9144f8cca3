package main

import (
	"context"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
)

const (
	// MirrorLabel marks a ConfigMap as a source to mirror ("true").
	MirrorLabel = "warmwatch.test/mirror"
	// MirrorOfLabel names a mirror's source on the mirror itself.
	MirrorOfLabel = "warmwatch.test/mirror-of"
	// MirrorSuffix makes a mirror's name from its source's.
	MirrorSuffix = "-mirror"
)

// MirrorReconciler keeps, for every ConfigMap labelled MirrorLabel=true, a
// ConfigMap <name>-mirror with the same data, controlled by the source (so
// the garbage collector removes it with the source).
type MirrorReconciler struct {
	Client client.Client
	Scheme *runtime.Scheme
	// Report is called once per Reconcile with its outcome.
	Report func(reconcileLine)
}

// Reconcile brings one source's mirror in line with the source.
func (r *MirrorReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	started := time.Now()
	line := reconcileLine{Kind: "reconcile", Namespace: req.Namespace, Name: req.Name}
	defer func() {
		line.DurationMs = time.Since(started).Milliseconds()
		if r.Report != nil {
			r.Report(line)
		}
	}()

	var source corev1.ConfigMap
	if err := r.Client.Get(ctx, req.NamespacedName, &source); err != nil {
		if apierrors.IsNotFound(err) {
			line.Result = "gone" // the mirror goes with it (owner reference)
			return ctrl.Result{}, nil
		}
		line.Result, line.Error = "error", err.Error()
		return ctrl.Result{}, err
	}
	line.SourceRV = source.ResourceVersion
	if source.Labels[MirrorLabel] != "true" || !source.DeletionTimestamp.IsZero() {
		line.Result = "ignored"
		return ctrl.Result{}, nil
	}

	mirror := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Namespace: source.Namespace,
		Name:      source.Name + MirrorSuffix,
	}}
	result, err := controllerutil.CreateOrUpdate(ctx, r.Client, mirror, func() error {
		if mirror.Labels == nil {
			mirror.Labels = map[string]string{}
		}
		mirror.Labels[MirrorOfLabel] = source.Name
		mirror.Data = maps.Clone(source.Data)
		mirror.BinaryData = maps.Clone(source.BinaryData)
		return controllerutil.SetControllerReference(&source, mirror, r.Scheme)
	})
	if err != nil {
		line.Result, line.Error = "error", err.Error()
		return ctrl.Result{}, err
	}
	line.Result = string(result)
	line.MirrorRV = mirror.ResourceVersion
	return ctrl.Result{}, nil
}

// SetupWithManager registers the controller: labelled ConfigMaps are
// reconciled, and a change to a mirror reconciles its source.
func (r *MirrorReconciler) SetupWithManager(mgr ctrl.Manager) error {
	labelled, err := predicate.LabelSelectorPredicate(metav1.LabelSelector{
		MatchLabels: map[string]string{MirrorLabel: "true"},
	})
	if err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("configmap-mirror").
		For(&corev1.ConfigMap{}, builder.WithPredicates(labelled)).
		Owns(&corev1.ConfigMap{}).
		Complete(r)
}
