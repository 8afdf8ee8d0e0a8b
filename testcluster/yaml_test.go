package testcluster

import (
	"strings"
	"testing"
)

func TestDecodeYAMLReadsEveryDocument(t *testing.T) {
	docs, err := DecodeYAML(strings.NewReader("a: 1\n---\n# comment only\n---\nb: 2\n---\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != 2 || docs[0].Object["a"] == nil || docs[1].Object["b"] == nil {
		t.Fatalf("got %d documents: %v", len(docs), docs)
	}
}
