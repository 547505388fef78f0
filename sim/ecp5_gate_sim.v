// Pad model for the gate-level board simulation (ringkv.sim.gatesim): synth_ecp5 maps the
// platform's IB/OBZ/BB to TRELLIS_IO; the netlist's TRELLIS_IO instances are renamed to
// RINGKV_GATE_PAD, a two-state model of yosys' TRELLIS_IO (share/ecp5/common_sim.vh) that
// does not drive an input pad with 'z' (Verilator rejects that at the top level). An output
// pad whose driver is disabled (T = 1) is driven to 1 (a pulled-up line) where the real pad
// floats. A bidirectional pad (DIR = "BIDIR") drives nothing: as the RTL simulation's BB
// (sim/ecp5_io_sim.v), its pin is the line's external side, which the testbench drives, and
// board_harness.expose_bidir_pads adds the FPGA's side ({pin}__fpga_oe = ~T,
// {pin}__fpga_o = I); O reads the FPGA's own bit while it drives, the line otherwise.
module RINGKV_GATE_PAD(inout B, input I, input T, output O);
  parameter DIR = "INPUT";
  generate
    if (DIR == "INPUT") begin
      assign O = B;
    end else if (DIR == "OUTPUT") begin
      assign B = T ? 1'b1 : I;
      assign O = 1'b0;
    end else begin
      assign O = T ? B : I;
    end
  endgenerate
endmodule

