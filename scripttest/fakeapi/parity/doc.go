// Package parity is the table of requests that keeps luaop test's fake API server
// honest: fakeapi's unit test runs it through the fake and compares with the
// answers written down here; e2e's parity test runs it through the fake and a real
// API server and compares the two (answers and objects).
//
// It owns the table (requests, the CRD they use, the recorded answers in
// testdata/) and the comparison; it calls the fake and whatever server it is
// given, and nothing else.
package parity
