// Command nereus is the Nereus broker and its command-line client.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	root := rootCmd
	addExtraCommands(root)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := root.ExecuteContext(ctx)
	stop()
	if err != nil {
		msg := err.Error()
		if !strings.HasPrefix(msg, "nereus: ") {
			msg = "nereus: " + msg
		}
		fmt.Fprintln(os.Stderr, msg)
		var coded interface{ ExitCode() int }
		if errors.As(err, &coded) {
			os.Exit(coded.ExitCode())
		}
		os.Exit(1)
	}
}
