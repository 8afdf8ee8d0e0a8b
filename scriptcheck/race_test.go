//go:build race

package scriptcheck

const raceDetector = true
