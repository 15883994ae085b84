package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/nereus-broker/nereus/client"
)

// extraCommands holds constructors of commands defined in other files of
// this package (serve, dev, ...). Append to it from an init function; main
// adds each to the root before running.
var extraCommands []func() *cobra.Command

// rootCmd is the command tree main runs. Other files may also call
// rootCmd.AddCommand from an init function.
var rootCmd = newRootCmd()

// Environment variables that supply defaults for the global flags.
const (
	envServer = "NEREUS_SERVER"
	envToken  = "NEREUS_TOKEN"
)

// newRootCmd builds the root command with the client verbs.
func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "nereus",
		Short:         "Nereus: a durable, replicated message broker",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	server := os.Getenv(envServer)
	if server == "" {
		server = client.DefaultServer
	}
	pf := root.PersistentFlags()
	pf.String("server", server, "broker address(es), comma-separated (env "+envServer+")")
	pf.String("token", os.Getenv(envToken), "authentication token (env "+envToken+")")
	pf.Duration("timeout", client.DefaultRequestTimeout, "timeout of each request")
	root.AddCommand(newTopicCmd(), newPubCmd(), newSubCmd(), newBenchCmd())
	return root
}

// addExtraCommands adds the commands registered in extraCommands that the
// root does not have yet.
func addExtraCommands(root *cobra.Command) {
	for _, newCmd := range extraCommands {
		cmd := newCmd()
		if existing, _, err := root.Find([]string{cmd.Name()}); err == nil && existing != root {
			continue
		}
		root.AddCommand(cmd)
	}
}

// clientOptions builds client options from the global flags. A command
// that defines its own --timeout (sub) keeps the default request timeout.
func clientOptions(cmd *cobra.Command) (client.Options, error) {
	server, err := cmd.Flags().GetString("server")
	if err != nil {
		return client.Options{}, err
	}
	token, err := cmd.Flags().GetString("token")
	if err != nil {
		return client.Options{}, err
	}
	timeout := client.DefaultRequestTimeout
	if f := cmd.Flags().Lookup("timeout"); f != nil && cmd.Root().PersistentFlags().Lookup("timeout") == f {
		timeout, err = cmd.Flags().GetDuration("timeout")
		if err != nil {
			return client.Options{}, err
		}
	}
	if timeout <= 0 {
		return client.Options{}, fmt.Errorf("--timeout must be positive, got %v", timeout)
	}
	servers := client.ParseServers(server)
	if len(servers) == 0 {
		return client.Options{}, fmt.Errorf("--server is empty")
	}
	return client.Options{
		Servers:        servers,
		Token:          token,
		ClientName:     "nereus-cli/" + cmd.Name(),
		DialTimeout:    min(timeout, client.DefaultDialTimeout),
		RequestTimeout: timeout,
	}, nil
}

// dial connects with the global flags.
func dial(ctx context.Context, cmd *cobra.Command) (*client.Client, client.Options, error) {
	opts, err := clientOptions(cmd)
	if err != nil {
		return nil, opts, err
	}
	c, err := client.Dial(ctx, opts)
	if err != nil {
		return nil, opts, fmt.Errorf("connect to %s: %w", opts.Servers[0], err)
	}
	return c, opts, nil
}

// withTimeout bounds ctx by d.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d)
}
