// Package promcheck checks deploy/components/prometheus with Prometheus's own rule
// parser (promtool check rules' rulefmt and PromQL parser). It is a module of its
// own so that Prometheus's dependencies never reach luaop's binary or go.mod:
// `make lint` runs its test.
package promcheck
