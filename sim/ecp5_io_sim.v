// Two-state models of the ECP5 IO buffers that amaranth's Lattice platform instantiates for
// the ULX3S pins (IB, OB, OBZ, BB), for the pin-level board simulation on Verilator
// (ringkv.sim.board_harness). They follow yosys' ECP5 cell models (share/ecp5/cells_io.vh on
// TRELLIS_IO in common_sim.vh) in every case the board top uses, but do not drive an input
// pad with 'z' (TRELLIS_IO's `assign B = 1'bz` in INPUT mode: Verilator rejects it,
// ASSIGNIN and "tristate in top-level IO"): a pad whose output enable is off (T = 1) reads
// as the level the testbench drives, and an output pad with T = 1 is driven to 1 here
// (a pulled-up line) where the real pad floats.
//
// A bidirectional pad (BB) cannot be one two-state top-level net driven from both sides, so
// its two sides are split: B is the line's external side only, an input that the testbench
// drives (the card's bit when the card drives, else 1: the pad's pull-up), and the FPGA's
// own drive (T, I) leaves the top through two extra ports per pin that
// board_harness.expose_bidir_pads adds ({pin}__fpga_oe = ~T, {pin}__fpga_o = I). What the
// FPGA reads (O) is the wired line: its own I while it drives (T = 0), else B. Both sides
// driving at once is a conflict on the real line; the testbench flags it (it sees both).
module IB (input I, output O);
  assign O = I;
endmodule

module OB (input I, output O);
  assign O = I;
endmodule

module OBZ (input I, input T, output O);
  assign O = T ? 1'b1 : I;
endmodule

module BB (input I, input T, output O, inout B);
  assign O = T ? B : I;
endmodule

// The I/O cells' registers that amaranth's FFBuffer and DDRBuffer put at the SDRAM's pins
// (the PHY of hw/sdram/phy.py): OFS1P3DX (output or output-enable register), IFS1P3DX (input
// register), both with SP (clock enable) and CD (asynchronous clear, tied to 0 by amaranth);
// FD1S3AX (the DDR buffer's output-enable delay). The SDRAM clock's ODDRX1F is in
// ecp5_oddr_sim.v (the gate-level build uses it too). Zero delay, two states; the registers
// start at 0 as the device's after configuration.
module OFS1P3DX (input D, input SP, input SCLK, input CD, output reg Q);
  initial Q = 1'b0;
  always @(posedge SCLK or posedge CD)
    if (CD) Q <= 1'b0; else if (SP) Q <= D;
endmodule

module IFS1P3DX (input D, input SP, input SCLK, input CD, output reg Q);
  initial Q = 1'b0;
  always @(posedge SCLK or posedge CD)
    if (CD) Q <= 1'b0; else if (SP) Q <= D;
endmodule

module FD1S3AX (input D, input CK, output reg Q);
  initial Q = 1'b0;
  always @(posedge CK) Q <= D;
endmodule
