// Package externalscaler is KEDA's external scaler API
// (externalscaler.proto, KEDA v2.21.0's, Apache-2.0), generated here rather
// than imported from KEDA's module, whose requirements would pull in
// hundreds of modules (docs/design.md, "KEDA's API generated here").
// gpupool-adapter serves it: adapter/kedascaler.
package externalscaler

//go:generate make -C ../.. generate-scaler
